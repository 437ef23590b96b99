package outboxcli_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestMigrateCommand: which connection `outbox migrate` takes, the
// statement functions it makes, --dry-run, and the refusal of a
// transaction pool.
// missingStatementFunctions is how many of this version's statement
// functions the database at dsn lacks.
func missingStatementFunctions(t *testing.T, dsn string) int {
	t.Helper()
	ctx := context.Background()
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	missing, err := outboxdb.UseStatementFunctions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	return missing
}

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

	// The schema's owner makes the statement functions a pooled service
	// runs through (docs/deployment.md, PgBouncer): once, and says so.
	t.Run("MakesTheStatementFunctionsOnce", func(t *testing.T) {
		dsn := pgtest.NewEmptyDB(t)
		t.Setenv("DATABASE_MIGRATE_URL", dsn)
		if out, err := runArgs(t, "outbox", "migrate"); err != nil || !strings.Contains(out, "made 5 statement functions") {
			t.Fatalf("outbox migrate of an empty database: %v, want it to make the 5 statement functions\n%s", err, out)
		}
		if out, err := runArgs(t, "outbox", "migrate"); err != nil || strings.Contains(out, "statement functions") {
			t.Fatalf("outbox migrate run again: %v, want nothing made\n%s", err, out)
		}
		if missing := missingStatementFunctions(t, dsn); missing != 0 {
			t.Fatalf("%d statement functions missing after outbox migrate, want none", missing)
		}
	})

	// Each version makes statement functions of its own; migrate says how
	// many other versions' it keeps, drops them when asked, and leaves
	// this version's.
	t.Run("DropsOtherVersionsStatementFunctionsWhenAsked", func(t *testing.T) {
		ctx := context.Background()
		dsn := pgtest.NewEmptyDB(t)
		t.Setenv("DATABASE_MIGRATE_URL", dsn)
		if _, err := runArgs(t, "outbox", "migrate"); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		// An earlier version's, as its migrate made them; and a function
		// of the user's that only looks alike.
		for _, ddl := range []string{
			`CREATE FUNCTION forward_stmt_insert_000000000000(a bigint[], "b c" text) RETURNS TABLE(id bigint) LANGUAGE sql AS 'SELECT 1::bigint'`,
			`CREATE FUNCTION forward_stmt_record_000000000000(a bigint[]) RETURNS TABLE(id bigint) LANGUAGE sql AS 'SELECT 1::bigint'`,
			`CREATE FUNCTION forward_stmtx(a int) RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		} {
			if _, err := conn.Exec(ctx, ddl); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := runArgs(t, "outbox", "migrate"); err != nil || !strings.Contains(out, "kept 2 statement functions of other versions") {
			t.Fatalf("outbox migrate with another version's functions: %v, want them kept and counted\n%s", err, out)
		}
		if out, err := runArgs(t, "outbox", "migrate", "--drop-old-statement-functions"); err != nil || !strings.Contains(out, "dropped 2 statement functions of other versions") {
			t.Fatalf("outbox migrate --drop-old-statement-functions: %v\n%s", err, out)
		}
		if out, err := runArgs(t, "outbox", "migrate", "--drop-old-statement-functions"); err != nil || strings.Contains(out, "statement function") {
			t.Fatalf("outbox migrate --drop-old-statement-functions again: %v, want nothing to say of them\n%s", err, out)
		}
		var left []string
		rows, err := conn.Query(ctx, `SELECT proname::text FROM pg_proc WHERE proname LIKE 'forward\_stmt%' ORDER BY 1`)
		if err == nil {
			left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 6 || !slices.Contains(left, "forward_stmtx") {
			t.Errorf("functions left %v: want this version's 5 and forward_stmtx", left)
		}
		if missing := missingStatementFunctions(t, dsn); missing != 0 {
			t.Fatalf("%d of this version's statement functions missing after the drop, want none", missing)
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
			!strings.Contains(out, "running instances: 1 session of forwarder instances") {
			t.Fatalf("outbox migrate --dry-run: %v\n%s", err, out)
		}
		if v, err := outboxdb.SchemaVersion(context.Background(), instance); err != nil || v != 0 {
			t.Fatalf("schema version %d after a dry run (%v), want 0", v, err)
		}
	})

	t.Run("AnUpgradeFromSchema4SaysWhatItLocksAndWaitsForTheInstancesToStop", func(t *testing.T) {
		ctx := context.Background()
		dsn := pgtest.NewEmptyDB(t)
		t.Setenv("DATABASE_MIGRATE_URL", dsn)
		ms, err := outboxdb.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outboxdb.MigrateConn(ctx, conn, outboxdb.MigrateOptions{Migrations: ms[:4]}); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
			SELECT 'k-' || g, 'VEHICLE_EVENT', 't', 0, g, convert_to(repeat('x', 500), 'UTF8') FROM generate_series(1, 1200) g;
			ANALYZE forward_records`); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		instance, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: outboxdb.ServiceApplicationName})
		if err != nil {
			t.Fatal(err)
		}
		defer instance.Close()
		if err := instance.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		plan := []string{"0005_messages_deliveries (offline", "copies forward_records (about 1 200 rows",
			"ACCESS EXCLUSIVE lock on forward_records and forward_retry_logs", "expect the lock for about", "stop every instance first"}
		out, err := runArgs(t, "outbox", "migrate", "--dry-run")
		t.Logf("outbox migrate --dry-run:\n%s", out)
		for _, want := range append(plan, "would apply: ", "running instances: 1 session of") {
			if err != nil || !strings.Contains(out, want) {
				t.Fatalf("outbox migrate --dry-run does not say %q (%v):\n%s", want, err, out)
			}
		}
		out, err = runArgs(t, "outbox", "migrate")
		if err == nil || !strings.Contains(err.Error(), "1 session of forwarder instances") || !strings.Contains(err.Error(), "--force") {
			t.Fatalf("outbox migrate while an instance runs: %v, want it refused naming the instances\n%s", err, out)
		}
		for _, want := range append(plan, "to apply: ") {
			if !strings.Contains(out, want) {
				t.Errorf("outbox migrate does not say %q before it starts:\n%s", want, out)
			}
		}
		if v, err := outboxdb.SchemaVersion(ctx, instance); err != nil || v != 4 {
			t.Fatalf("schema version %d after a refused migration (%v), want 4", v, err)
		}
		instance.Close()
		if out, err := runArgs(t, "outbox", "migrate"); err != nil || !strings.Contains(out, fmt.Sprintf("schema migrated from version 4 to %d", outboxdb.LatestVersion())) {
			t.Fatalf("outbox migrate with the instances stopped: %v\n%s", err, out)
		}
		pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM forward_messages JOIN forward_deliveries USING (id) WHERE status = 'PENDING'").Scan(&n); err != nil || n != 1200 {
			t.Fatalf("%d PENDING messages after the upgrade (%v), want the 1 200 of schema 4", n, err)
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
