package outboxcli_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestMigrateCommand: which connection `outbox migrate` takes, --dry-run,
// and the refusal of a transaction pool.
func TestMigrateCommand(t *testing.T) {
	// Not parallel: t.Setenv.
	const unreachable = "postgres://127.0.0.1:1/none?connect_timeout=2"

	t.Run("DATABASE_MIGRATE_URLWinsOverDATABASE_DIRECT_URLAndDATABASE_URL", func(t *testing.T) {
		dsn := pgtest.NewEmptyDB(t)
		t.Setenv("DATABASE_URL", unreachable)
		t.Setenv("DATABASE_DIRECT_URL", unreachable)
		t.Setenv("DATABASE_MIGRATE_URL", dsn)
		out, err := runArgs(t, "outbox", "migrate")
		if err != nil || !strings.Contains(out, "schema migrated from version 0") || !strings.Contains(out, "to apply: 0001_init (online)") {
			t.Fatalf("outbox migrate with DATABASE_MIGRATE_URL: %v\n%s", err, out)
		}
	})

	t.Run("DATABASE_DIRECT_URLWinsOverDATABASE_URL", func(t *testing.T) {
		dsn := pgtest.NewDB(t)
		t.Setenv("DATABASE_URL", unreachable)
		t.Setenv("DATABASE_DIRECT_URL", dsn)
		t.Setenv("DATABASE_MIGRATE_URL", "")
		if out, err := runArgs(t, "outbox", "migrate"); err != nil || !strings.Contains(out, "schema is up to date") {
			t.Fatalf("outbox migrate with DATABASE_DIRECT_URL: %v\n%s", err, out)
		}
	})

	t.Run("DryRunChangesNothingAndNamesTheInstances", func(t *testing.T) {
		dsn := pgtest.NewEmptyDB(t)
		t.Setenv("DATABASE_MIGRATE_URL", dsn)
		instance, err := outboxdb.Open(context.Background(), dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: outboxdb.ServiceApplicationName})
		if err != nil {
			t.Fatal(err)
		}
		defer instance.Close()
		out, err := runArgs(t, "outbox", "migrate", "--dry-run")
		if err != nil || !strings.Contains(out, "is at schema version 0") || !strings.Contains(out, "would apply: 0001_init") ||
			!strings.Contains(out, "running instances: 1 sessions of forwarder instances") {
			t.Fatalf("outbox migrate --dry-run: %v\n%s", err, out)
		}
		if v, err := outboxdb.SchemaVersion(context.Background(), instance); err != nil || v != 0 {
			t.Fatalf("schema version %d after a dry run (%v), want 0", v, err)
		}
	})

	t.Run("ATransactionPoolIsRefused", func(t *testing.T) {
		dsn := pgtest.NewEmptyDB(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(u.Port())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Dir: t.TempDir() + "/bouncer", ServerPort: port})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop()
		t.Setenv("DATABASE_MIGRATE_URL", b.DSN(strings.TrimPrefix(u.Path, "/")))
		out, err := runArgs(t, "outbox", "migrate")
		if err == nil || !strings.Contains(err.Error(), "DATABASE_MIGRATE_URL") || !strings.Contains(err.Error(), "transaction-pooling") ||
			!strings.Contains(err.Error(), "at PostgreSQL itself") {
			t.Fatalf("outbox migrate through PgBouncer: %v\n%s", err, out)
		}
	})
}
