package outboxdb_test

import (
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The tests wait on PostgreSQL far more than they use the CPU: eight run at
// once, where GOMAXPROCS (two on the CI machine) leaves the cores idle while
// two tests wait.
func TestMain(m *testing.M) { pgtest.MainParallel(m, 8) }
