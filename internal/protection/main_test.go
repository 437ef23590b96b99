package protection

import (
	"io"
	"log/slog"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quietLog = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(io.Discard, nil)))
