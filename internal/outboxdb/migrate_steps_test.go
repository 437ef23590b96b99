package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestParseMigration(t *testing.T) {
	t.Parallel()

	t.Run("PlainFileIsOneOfflineTransactionStep", func(t *testing.T) {
		m, err := outboxdb.ParseMigration("0007_add.sql", "-- why\nALTER TABLE t ADD COLUMN c int;\nCREATE TABLE u (x int);\n")
		if err != nil {
			t.Fatal(err)
		}
		if m.Version != 7 || m.Name != "0007_add" || m.Online || len(m.Steps) != 1 || m.Steps[0].Mode != outboxdb.StepTransaction {
			t.Fatalf("got %+v", m)
		}
		if got, want := m.Describe(), "0007_add (offline: no instance may use the database while it runs), 1 step: transaction"; got != want {
			t.Errorf("described as %q, want %q", got, want)
		}
	})

	t.Run("Steps", func(t *testing.T) {
		m, err := outboxdb.ParseMigration("0010_steps.sql", `-- migration: online
-- A header comment.
ALTER TABLE t ADD COLUMN c int;

-- step: batch
-- Fill c in small transactions.
UPDATE t SET c = 0 WHERE id IN (SELECT id FROM t WHERE c IS NULL LIMIT 100);

-- step: concurrent
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_c_idx ON t (c);

-- step: concurrent
create index concurrently "Odd Name" on t (c);

-- step: transaction
ALTER TABLE t ADD CONSTRAINT c_check CHECK (c >= 0) NOT VALID;
`)
		if err != nil {
			t.Fatal(err)
		}
		want := []outboxdb.Step{
			{Mode: outboxdb.StepTransaction}, {Mode: outboxdb.StepBatch},
			{Mode: outboxdb.StepConcurrent, Index: "t_c_idx"}, {Mode: outboxdb.StepConcurrent, Index: `"Odd Name"`},
			{Mode: outboxdb.StepTransaction},
		}
		if !m.Online || len(m.Steps) != len(want) {
			t.Fatalf("online %v, %d steps, want online and %d: %+v", m.Online, len(m.Steps), len(want), m.Steps)
		}
		for i, w := range want {
			if got := m.Steps[i]; got.Mode != w.Mode || got.Index != w.Index {
				t.Errorf("step %d: %s index %q, want %s index %q", i+1, got.Mode, got.Index, w.Mode, w.Index)
			}
		}
		if !strings.Contains(m.Steps[1].SQL, "UPDATE t SET c = 0") || strings.Contains(m.Steps[0].SQL, "UPDATE") {
			t.Errorf("steps split at the wrong place: %q / %q", m.Steps[0].SQL, m.Steps[1].SQL)
		}
		if got, want := m.Describe(), `0010_steps (online), 5 steps: transaction, batch, concurrent index t_c_idx, concurrent index "Odd Name", transaction`; got != want {
			t.Errorf("described as %q, want %q", got, want)
		}
	})

	t.Run("Mistakes", func(t *testing.T) {
		for _, c := range []struct{ name, file, text, want string }{
			{"BadName", "add.sql", "SELECT 1;", "NNNN_description.sql"},
			{"UnknownMode", "0001_x.sql", "SELECT 1;\n-- step: parallel\nSELECT 2;", `unknown step mode "parallel"`},
			{"UnknownDirective", "0001_x.sql", "-- migration: offline\nSELECT 1;", "unknown directive"},
			{"EmptyStep", "0001_x.sql", "SELECT 1;\n-- step: batch\n-- nothing yet\n", "step 2 (batch) holds no statement"},
			{"TwoStatementsOutsideATransaction", "0001_x.sql", "-- step: concurrent\nCREATE INDEX CONCURRENTLY a ON t (x); CREATE INDEX CONCURRENTLY b ON t (y);", "must be one statement"},
			{"NothingAtAll", "0001_x.sql", "-- only a comment\n", "holds no statement"},
		} {
			if _, err := outboxdb.ParseMigration(c.file, c.text); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: err = %v, want it to say %q", c.name, err, c.want)
			}
		}
	})

	t.Run("EmbeddedMigrationsSayWhetherTheyAreOnline", func(t *testing.T) {
		// Each only adds, and was applied on start while instances of the
		// version before ran, except schema 5's, which copies every row
		// into the new tables and drops the old ones: instances of schema 4
		// cannot run beside it or after it.
		for _, m := range mustMigrations(t) {
			if want := m.Version != 5; m.Online != want {
				t.Errorf("%s: online %v, want %v", m.Name, m.Online, want)
			}
		}
	})
}

// liveMigration is the embedded migrations followed by a test migration,
// version (after the embedded ones) and text.
func liveMigration(t *testing.T, version int, text string) []outboxdb.Migration {
	t.Helper()
	m, err := outboxdb.ParseMigration(fmt.Sprintf("%04d_test.sql", version), text)
	if err != nil {
		t.Fatal(err)
	}
	return append(mustMigrations(t), m)
}

// migrateSession runs MigrateConn on a connection of its own, closed after.
func migrateSession(ctx context.Context, dsn string, opts outboxdb.MigrateOptions) (outboxdb.MigrateResult, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return outboxdb.MigrateResult{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return outboxdb.MigrateConn(ctx, conn, opts)
}

// dbWith is a new migrated database on which setup has run.
func dbWith(t *testing.T, setup string) (string, *pgxpool.Pool) {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	if _, err := pool.Exec(context.Background(), setup); err != nil {
		t.Fatal(err)
	}
	return dsn, pool
}

// holdLock opens a transaction that takes lockSQL's locks and keeps them
// until the returned function is called (or the test ends).
func holdLock(t *testing.T, dsn, lockSQL string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}

func TestMigrateSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("StepsRunInOrderAndTheMigrationIsRecorded", func(t *testing.T) {
		t.Parallel()
		dsn, pool := dbWith(t, `CREATE TABLE t (id int PRIMARY KEY, c int);
			INSERT INTO t SELECT g, NULL FROM generate_series(1, 1050) g`)
		ms := liveMigration(t, 101, `-- migration: online
ALTER TABLE t ALTER COLUMN c SET DEFAULT 0;
-- step: batch
UPDATE t SET c = id WHERE id IN (SELECT id FROM t WHERE c IS NULL ORDER BY id LIMIT 100);
-- step: concurrent
CREATE INDEX CONCURRENTLY t_c_idx ON t (c);
-- step: transaction
ALTER TABLE t ADD CONSTRAINT t_c_check CHECK (c > 0) NOT VALID;
-- step: transaction
ALTER TABLE t VALIDATE CONSTRAINT t_c_check;
`)
		var lines []string
		res, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms, Progress: func(l string) { lines = append(lines, l) }})
		if err != nil {
			t.Fatal(err)
		}
		if res.From != outboxdb.LatestVersion() || res.To != 101 || len(res.Applied) != 1 {
			t.Fatalf("result %+v, want %d -> 101", res, outboxdb.LatestVersion())
		}
		var nulls, steps int
		var valid, validated bool
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM t WHERE c IS NULL),
				(SELECT count(*) FROM forwarder_schema_steps),
				(SELECT indisvalid FROM pg_index WHERE indexrelid = 't_c_idx'::regclass),
				(SELECT convalidated FROM pg_constraint WHERE conname = 't_c_check')`).Scan(&nulls, &steps, &valid, &validated); err != nil {
			t.Fatal(err)
		}
		if nulls != 0 || steps != 0 || !valid || !validated {
			t.Errorf("after the migration: %d rows not filled, %d step records left, index valid %v, constraint validated %v", nulls, steps, valid, validated)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, pool); v != 101 {
			t.Errorf("schema version %d, want 101", v)
		}
		if joined := strings.Join(lines, "\n"); !strings.Contains(joined, "step 2 of 5 (batch): done") || !strings.Contains(joined, "1050 rows changed") {
			t.Errorf("progress does not report the batch step and its rows:\n%s", joined)
		}
	})

	// A concurrent index build waits for every transaction running in the
	// database; a migrator waiting for the migration lock inside a
	// statement was one, so instances starting together deadlocked.
	t.Run("MigratorsStartingTogetherTakeTurnsAcrossAConcurrentBuild", func(t *testing.T) {
		t.Parallel()
		dsn, _ := dbWith(t, `CREATE TABLE t (id int PRIMARY KEY, c int);
			INSERT INTO t SELECT g, g FROM generate_series(1, 50000) g`)
		ms := liveMigration(t, 101, `-- migration: online
-- step: concurrent
CREATE INDEX CONCURRENTLY t_c_idx ON t (c);
`)
		errs, total := migrateTogether(4, func() (outboxdb.MigrateResult, error) {
			return migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms})
		})
		for i, err := range errs {
			if err != nil {
				t.Errorf("migrator %d: %v", i, err)
			}
		}
		if total != 1 {
			t.Errorf("the migration was applied %d times, want once", total)
		}
	})

	t.Run("AFailedMigrationResumesAtTheStepThatFailed", func(t *testing.T) {
		t.Parallel()
		dsn, pool := pgtest.NewDBPool(t)
		broken := liveMigration(t, 102, `CREATE TABLE resumed (id int);
-- step: transaction
INSERT INTO resumed VALUES (1);
SELECT 1 / 0;
`)
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: broken}); err == nil || !strings.Contains(err.Error(), "step 2") {
			t.Fatalf("err = %v, want step 2 to fail", err)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, pool); v != outboxdb.LatestVersion() {
			t.Fatalf("schema version %d after a failed migration, want %d", v, outboxdb.LatestVersion())
		}
		// Step 1 ran and is not run again (CREATE TABLE would fail); step 2
		// left nothing behind.
		fixed := liveMigration(t, 102, `CREATE TABLE resumed (id int);
-- step: transaction
INSERT INTO resumed VALUES (1);
`)
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: fixed}); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM resumed").Scan(&n); err != nil || n != 1 {
			t.Fatalf("resumed holds %d rows (%v), want 1", n, err)
		}
	})

	t.Run("AFailedConcurrentBuildLeavesNoInvalidIndex", func(t *testing.T) {
		t.Parallel()
		dsn, pool := dbWith(t, `CREATE TABLE t (x int); INSERT INTO t VALUES (1), (1)`)
		ms := liveMigration(t, 103, "-- step: concurrent\nCREATE UNIQUE INDEX CONCURRENTLY t_x_key ON t (x);\n")
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms}); err == nil || !strings.Contains(err.Error(), "could not create unique index") {
			t.Fatalf("err = %v, want the duplicate to fail the build", err)
		}
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 't_x_key'").Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d indexes t_x_key left after the failed build (%v), want none", left, err)
		}
	})

	t.Run("AnInvalidIndexLeftBehindIsBuiltAgainAndAValidOneKept", func(t *testing.T) {
		t.Parallel()
		// What an interrupted CREATE INDEX CONCURRENTLY leaves: an invalid index.
		dsn, pool := dbWith(t, `CREATE TABLE t (x int); INSERT INTO t VALUES (1), (1)`)
		if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY t_x_key ON t (x)`); err == nil {
			t.Fatal("the duplicate did not fail the build")
		}
		if _, err := pool.Exec(ctx, `DELETE FROM t WHERE ctid = (SELECT max(ctid) FROM t)`); err != nil {
			t.Fatal(err)
		}
		ms := liveMigration(t, 104, "-- step: concurrent\nCREATE UNIQUE INDEX CONCURRENTLY t_x_key ON t (x);\n")
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms}); err != nil {
			t.Fatal(err)
		}
		var valid bool
		if err := pool.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 't_x_key'::regclass").Scan(&valid); err != nil || !valid {
			t.Fatalf("t_x_key valid %v (%v), want a valid index", valid, err)
		}
		// A valid index of that name is what a run that stopped before
		// recording the step leaves: kept, not an error.
		again := liveMigration(t, 105, "-- step: concurrent\nCREATE UNIQUE INDEX CONCURRENTLY t_x_key ON t (x);\n")
		if _, err := pool.Exec(ctx, "DELETE FROM forwarder_schema_migrations WHERE version = 104"); err != nil {
			t.Fatal(err)
		}
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: again}); err != nil {
			t.Fatalf("a valid index of the step's name: %v", err)
		}
	})

	t.Run("ALockNotGrantedInTimeIsTriedAgain", func(t *testing.T) {
		t.Parallel()
		dsn, pool := pgtest.NewDBPool(t)
		release := holdLock(t, dsn, "SELECT count(*) FROM forward_deliveries")
		go func() { time.Sleep(1500 * time.Millisecond); release() }()
		ms := liveMigration(t, 106, "ALTER TABLE forward_deliveries ADD COLUMN retried integer;\n")
		var mu sync.Mutex
		var lines []string
		_, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms, LockTimeout: 200 * time.Millisecond,
			Progress: func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if joined := strings.Join(lines, "\n"); !strings.Contains(joined, "got no lock within 200ms") || !strings.Contains(joined, "trying again") {
			t.Errorf("progress does not report the retries:\n%s", joined)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, pool); v != 106 {
			t.Errorf("schema version %d, want 106", v)
		}
	})

	t.Run("GivesUpAfterLockWaitNamingTheLockTimeout", func(t *testing.T) {
		t.Parallel()
		dsn, pool := pgtest.NewDBPool(t)
		holdLock(t, dsn, "SELECT count(*) FROM forward_deliveries")
		ms := liveMigration(t, 107, "ALTER TABLE forward_deliveries ADD COLUMN never integer;\n")
		_, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: ms, LockTimeout: 100 * time.Millisecond, LockWait: time.Second})
		if err == nil || !strings.Contains(err.Error(), "gave up after") || !strings.Contains(err.Error(), "lock_timeout 100ms") {
			t.Fatalf("err = %v, want it to give up naming the lock timeout", err)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, pool); v != outboxdb.LatestVersion() {
			t.Errorf("schema version %d, want %d", v, outboxdb.LatestVersion())
		}
	})

	t.Run("AnOfflineMigrationWaitsForTheInstancesUnlessForced", func(t *testing.T) {
		t.Parallel()
		dsn, pool := pgtest.NewDBPool(t)
		// A running instance: a session named as the service names its own.
		instance, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: outboxdb.ServiceApplicationName})
		if err != nil {
			t.Fatal(err)
		}
		defer instance.Close()
		offline := liveMigration(t, 108, "ALTER TABLE forward_deliveries ADD COLUMN offline_col integer;\n")
		_, err = migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: offline})
		if !errors.Is(err, outboxdb.ErrInstancesRunning) || !strings.Contains(err.Error(), "1 session of forwarder instances") || !strings.Contains(err.Error(), "108_test") {
			t.Fatalf("err = %v, want ErrInstancesRunning naming the session and the migration", err)
		}
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: offline, OnlineOnly: true}); !errors.Is(err, outboxdb.ErrSchemaBehind) || !strings.Contains(err.Error(), "forwarder outbox migrate") {
			t.Fatalf("on start: err = %v, want ErrSchemaBehind naming the command", err)
		}
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: offline, Force: true}); err != nil {
			t.Fatalf("forced: %v", err)
		}
		next := liveMigration(t, 109, "-- migration: online\nALTER TABLE forward_deliveries ADD COLUMN online_col integer;\n")
		online := append(offline, next[len(next)-1])
		if _, err := migrateSession(ctx, dsn, outboxdb.MigrateOptions{Migrations: online}); err != nil {
			t.Fatalf("an online migration beside a running instance: %v", err)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, pool); v != 109 {
			t.Errorf("schema version %d, want 109", v)
		}
	})
}

func TestEnsureSchemaLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ARoleThatMayNotMigrateIsToldWhatToRun", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.NewEmptyDB(t)
		owner := openPool(t, dsn)
		migrateTo(t, owner, mustMigrations(t)[:3])
		role := pgtest.LoginRole(t, dsn, "svc")
		if _, err := owner.Exec(ctx, "GRANT USAGE ON SCHEMA public TO "+role+"; GRANT SELECT ON forwarder_schema_migrations TO "+role); err != nil {
			t.Fatal(err)
		}
		svc := openPool(t, pgtest.AsRole(t, dsn, role))
		err := outboxdb.EnsureSchema(ctx, svc, nil)
		if !errors.Is(err, outboxdb.ErrSchemaBehind) || !strings.Contains(err.Error(), "run `forwarder outbox migrate`") || !strings.Contains(err.Error(), "role "+strings.Trim(role, `"`)) {
			t.Fatalf("err = %v, want ErrSchemaBehind naming the role and the command", err)
		}
		if v, _ := outboxdb.SchemaVersion(ctx, owner); v != 3 {
			t.Fatalf("schema version %d, want 3: the service role changed it", v)
		}
	})

	t.Run("AStartDuringAMigrationWaitsForIt", func(t *testing.T) {
		t.Parallel()
		dsn, pool := pgtest.NewDBPool(t)
		holdLock(t, dsn, "SELECT pg_advisory_xact_lock(x'666f727761726472'::bigint)")
		if _, err := outboxdb.ReadSchemaState(ctx, pool); !errors.Is(err, outboxdb.ErrMigrationRunning) {
			t.Fatalf("err = %v, want ErrMigrationRunning", err)
		}
	})
}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := outboxdb.Open(context.Background(), dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
