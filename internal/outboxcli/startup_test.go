package outboxcli_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/outboxcli"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestStartChecksPendingOfflineMigrations: the service starts on a database
// without a schema (its first component creates the whole schema, offline
// migrations included: no instance of an earlier version uses it), and
// refuses to start on a schema-4 database, whose offline migration 0005
// must run with every instance stopped, naming the command to run.
func TestStartChecksPendingOfflineMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	if err := outboxcli.CheckDatabase(pgtest.NewEmptyDB(t)); err != nil {
		t.Errorf("on an empty database: %v, want a start", err)
	}

	dsn := pgtest.NewEmptyDB(t)
	ms, err := outboxdb.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var upTo4 []outboxdb.Migration
	for _, m := range ms {
		if m.Version <= 4 {
			upTo4 = append(upTo4, m)
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := outboxdb.MigrateConn(ctx, conn, outboxdb.MigrateOptions{Migrations: upTo4}); err != nil {
		t.Fatal(err)
	}
	err = outboxcli.CheckDatabase(dsn)
	if !errors.Is(err, outboxdb.ErrSchemaBehind) || !strings.Contains(err.Error(), "at version 4") ||
		!strings.Contains(err.Error(), "0005_messages_deliveries") || !strings.Contains(err.Error(), "forwarder outbox migrate") {
		t.Errorf("on a schema-4 database: %v, want ErrSchemaBehind naming 0005 and the command", err)
	}
}

// TestStartRefusesAPoolerThatIsNotReadCommitted: on a database whose
// sessions default to serializable, the service's own connections ask for
// read committed and it starts; through a pooler (DATABASE_DIRECT_URL set)
// they cannot, and start-up refuses, naming the statement that mends it.
func TestStartRefusesAPoolerThatIsNotReadCommitted(t *testing.T) {
	t.Parallel()
	dsn, admin := pgtest.NewDBPool(t)
	pgtest.SetForDatabase(t, admin, "default_transaction_isolation", "serializable")
	if err := outboxcli.CheckDatabase(dsn); err != nil {
		t.Errorf("direct connections: %v, want a start", err)
	}
	err := outboxcli.CheckDatabaseDirect(dsn, dsn)
	if err == nil || !strings.Contains(err.Error(), `DATABASE_URL: its sessions default to isolation level "serializable"`) ||
		!strings.Contains(err.Error(), `ALTER ROLE "postgres" SET default_transaction_isolation = 'read committed'`) {
		t.Errorf("through a pooler: %v, want a refusal naming ALTER ROLE", err)
	}
}

// TestAnOutboxWhereSearchPathDoesNotLead: an administrator changed the
// database's search_path to another schema. The service found no outbox
// there and made a new, empty one, leaving the rows of the first unsent;
// now start-up refuses, naming both, and the service's own check
// (EnsureSchema) makes nothing, and the console says where the outbox is
// rather than advising a migration. `outbox migrate`, an operator's
// explicit step, says so and makes the second outbox.
func TestAnOutboxWhereSearchPathDoesNotLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := pgtest.NewDBPool(t)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA other"); err != nil {
		t.Fatal(err)
	}
	pgtest.SetForDatabase(t, admin, "search_path", "other")
	tablesInOther := func() int {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'other'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	err := outboxcli.CheckDatabase(dsn)
	if !errors.Is(err, outboxdb.ErrSchemaElsewhere) || !strings.Contains(err.Error(), `search_path is "other", schema public holds an outbox`) {
		t.Errorf("start-up: %v, want ErrSchemaElsewhere naming search_path and schema public", err)
	}
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outboxdb.EnsureSchema(ctx, pool, nil); !errors.Is(err, outboxdb.ErrSchemaElsewhere) {
		t.Errorf("the service's schema check: %v, want ErrSchemaElsewhere", err)
	}
	if n := tablesInOther(); n != 0 {
		t.Fatalf("the service made %d tables in schema other", n)
	}

	b := &testBundle{dsn: dsn, pool: admin}
	// The console advised `outbox migrate` for a schema at version 0.
	type result struct {
		out string
		err error
	}
	console := make(chan result, 1)
	go func() {
		out, err := b.run(t, "console", "--read-only", "--addr", "127.0.0.1:0")
		console <- result{out, err}
	}()
	select {
	case r := <-console:
		if r.err == nil || !strings.Contains(r.err.Error(), `search_path is "other", schema public holds an outbox`) {
			t.Errorf("outbox console: %v, want it to say where the outbox is:\n%s", r.err, r.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("outbox console started serving an outbox its search_path does not lead to")
	}
	out := b.mustRun(t, "migrate")
	if !strings.Contains(out, `note: schema public already holds an outbox, which search_path "other" does not lead to`) {
		t.Errorf("outbox migrate does not say there is an outbox elsewhere:\n%s", out)
	}
	if tablesInOther() == 0 {
		t.Error("outbox migrate made no outbox in schema other")
	}
	if err := outboxcli.CheckDatabase(dsn); err != nil {
		t.Errorf("start-up once the second outbox exists: %v", err)
	}
}

// TestConsoleWaitsForAMigrationInProgress: a console started while a
// migration holds its lock (a Helm upgrade's Job, a starting instance) says
// it waits, serves nothing meanwhile, and starts once the migration has
// finished, instead of exiting.
func TestConsoleWaitsForAMigrationInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	endMigration := pgtest.HoldMigrationLock(t, b.dsn)
	var out logbuf.Buffer
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.runCtx(runCtx, t, &out, "console", "--read-only", "--addr", "127.0.0.1:0") }()
	waitForOutput := func(what string) {
		t.Helper()
		for !strings.Contains(out.String(), what) {
			select {
			case err := <-done:
				t.Fatalf("outbox console returned %v before saying %q:\n%s", err, what, out.String())
			case <-ctx.Done():
				t.Fatalf("outbox console did not say %q:\n%s", what, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	waitForOutput("waiting for the schema migration in progress to finish")
	time.Sleep(1500 * time.Millisecond) // a look or two while it waits
	if strings.Contains(out.String(), "console on http://") {
		t.Fatalf("the console served during the migration:\n%s", out.String())
	}
	endMigration()
	waitForOutput("console on http://")
	stop()
	if err := <-done; err != nil {
		t.Errorf("outbox console stopped with %v, want nil", err)
	}
	if n := strings.Count(out.String(), "waiting for the schema migration"); n != 1 {
		t.Errorf("said %d times that it waits, want once:\n%s", n, out.String())
	}
}
