package forwarder

import (
	"testing"

	"github.com/forwarder/forwarder/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
