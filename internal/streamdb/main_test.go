package streamdb

import (
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
