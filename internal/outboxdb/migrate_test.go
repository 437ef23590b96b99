package outboxdb_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func openEmpty(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := outboxdb.Open(context.Background(), pgtest.NewEmptyDB(t), outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CreatesSchemaThenIsANoOp", func(t *testing.T) {
		t.Parallel()
		pool := openEmpty(t)
		first, err := outboxdb.Migrate(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if first.From != 0 || first.To != outboxdb.LatestVersion() || len(first.Applied) == 0 {
			t.Fatalf("first run: %+v, want 0 -> %d", first, outboxdb.LatestVersion())
		}
		second, err := outboxdb.Migrate(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if len(second.Applied) != 0 || second.From != first.To {
			t.Fatalf("second run applied %v (from %d), want nothing", second.Applied, second.From)
		}
	})

	t.Run("ConcurrentRunsBothSucceed", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.NewEmptyDB(t)
		errs, total := migrateTogether(4, func() (outboxdb.MigrateResult, error) {
			// Separate pools, as separate instances would have.
			pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
			if err != nil {
				return outboxdb.MigrateResult{}, err
			}
			defer pool.Close()
			return outboxdb.Migrate(ctx, pool)
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("migration %d: %v", i, err)
			}
		}
		if want := len(mustMigrations(t)); total != want {
			t.Fatalf("migrations applied %d times in all, want each once (%d)", total, want)
		}
	})

	t.Run("RefusesNewerSchema", func(t *testing.T) {
		t.Parallel()
		pool := openEmpty(t)
		if _, err := outboxdb.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "INSERT INTO forwarder_schema_migrations (version, name) VALUES (9999, '9999_future')"); err != nil {
			t.Fatal(err)
		}
		_, err := outboxdb.Migrate(ctx, pool)
		if !errors.Is(err, outboxdb.ErrSchemaTooNew) || !strings.Contains(err.Error(), "9999") {
			t.Fatalf("err = %v, want ErrSchemaTooNew naming version 9999", err)
		}
	})
}

// migrateTo applies ms (and nothing newer) to the database of pool.
func migrateTo(t *testing.T, pool *pgxpool.Pool, ms []outboxdb.Migration, opts ...outboxdb.MigrateOptions) outboxdb.MigrateResult {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Conn().Close(ctx) // its session settings go with it
	o := outboxdb.MigrateOptions{}
	if len(opts) > 0 {
		o = opts[0]
	}
	o.Migrations = ms
	res, err := outboxdb.MigrateConn(ctx, conn.Conn(), o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func mustMigrations(t *testing.T) []outboxdb.Migration {
	t.Helper()
	ms, err := outboxdb.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)

	columns := func(table string) map[string]string {
		rows, err := pool.Query(ctx, `SELECT column_name, data_type FROM information_schema.columns
			WHERE table_schema = 'public' AND table_name = $1`, table)
		if err != nil {
			t.Fatal(err)
		}
		cols := map[string]string{}
		for rows.Next() {
			var n, ty string
			if err := rows.Scan(&n, &ty); err != nil {
				t.Fatal(err)
			}
			cols[n] = ty
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return cols
	}

	t.Run("RecordColumns", func(t *testing.T) {
		cols := columns("forward_records")
		want := map[string]string{
			"id": "bigint", "message_key": "text", "api_type": "text", "kafka_topic": "text",
			"kafka_partition": "integer", "kafka_offset": "bigint", "kafka_key": "bytea",
			"payload": "bytea", "status": "text", "attempt_count": "integer",
			"next_retry_at": "timestamp with time zone", "last_http_status": "integer",
			"last_error": "text", "created_at": "timestamp with time zone",
			"updated_at": "timestamp with time zone", "succeeded_at": "timestamp with time zone",
			"claim_token": "uuid", "claimed_by": "text",
		}
		for name, ty := range want {
			if cols[name] != ty {
				t.Errorf("forward_records.%s: type %q, want %q", name, cols[name], ty)
			}
		}
	})

	t.Run("LogColumns", func(t *testing.T) {
		cols := columns("forward_retry_logs")
		for _, name := range []string{"id", "record_id", "record_created_at", "attempt_number", "result_status", "http_status",
			"platform_errcode", "error_message", "duration_ms", "attempted_at", "next_retry_at", "attempted_by"} {
			if _, ok := cols[name]; !ok {
				t.Errorf("forward_retry_logs.%s is missing", name)
			}
		}
	})

	t.Run("Indexes", func(t *testing.T) {
		rows, err := pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'`)
		if err != nil {
			t.Fatal(err)
		}
		defs := map[string]string{}
		for rows.Next() {
			var n, d string
			if err := rows.Scan(&n, &d); err != nil {
				t.Fatal(err)
			}
			defs[n] = d
		}
		for name, fragment := range map[string]string{
			"forward_deliveries_message_key_key": "UNIQUE INDEX forward_deliveries_message_key_key ON public.forward_deliveries USING btree (message_key)",
			"forward_deliveries_due_idx":         "(next_retry_at, id) WHERE ((status = ANY (ARRAY['PENDING'::text, 'IN_PROGRESS'::text])) AND (NOT order_held))",
			"forward_deliveries_order_head_key":  "UNIQUE INDEX forward_deliveries_order_head_key ON public.forward_deliveries USING btree (ordering_key) WHERE ((ordering_key IS NOT NULL) AND (status = ANY (ARRAY['PENDING'::text, 'IN_PROGRESS'::text])) AND (NOT order_held))",
			"forward_deliveries_status_idx":      "(status, updated_at)",
			"forward_messages_pkey":              "ON ONLY public.forward_messages USING btree (id, created_at)",
			"forward_messages_key_idx":           "ON ONLY public.forward_messages USING btree (message_key)",
			"forward_messages_plate_idx":         "(plate_no, id) WHERE (plate_no IS NOT NULL)",
			"forward_messages_park_idx":          "(park_code, berth_code, id) WHERE (park_code IS NOT NULL)",
			"forward_retry_logs_record_id_idx":   "ON ONLY public.forward_retry_logs USING btree (record_id, id)",
		} {
			if !strings.Contains(defs[name], fragment) {
				t.Errorf("index %s = %q, want it to contain %q", name, defs[name], fragment)
			}
		}
		// Every partition has the parent's indexes.
		var missing int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i
			JOIN pg_index pi ON pi.indrelid = i.inhparent
			WHERE i.inhparent IN ('forward_messages'::regclass, 'forward_retry_logs'::regclass)
			  AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index ci ON ci.indexrelid = ii.inhrelid
			                  WHERE ii.inhparent = pi.indexrelid AND ci.indrelid = i.inhrelid)`).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		if missing != 0 {
			t.Errorf("%d partition indexes missing", missing)
		}
	})

	t.Run("Constraints", func(t *testing.T) {
		// The delivery state refuses what no statement may write: a second
		// row for a key, an unknown status, a delivered (SUCCESS) row
		// (delivery rows are deleted instead), an unfinished row never due.
		insert := func(id int64, key, status string, due bool) error {
			_, err := pool.Exec(ctx, `INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
				VALUES ($1, now(), $2, $3, CASE WHEN $4 THEN now() END, 2)`, id, key, status, due)
			return err
		}
		if err := insert(1, "ok", "PENDING", true); err != nil {
			t.Fatalf("valid row rejected: %v", err)
		}
		for i, c := range []struct {
			name, key, status string
			due               bool
		}{
			{"DuplicateKey", "ok", "PENDING", true},
			{"UnknownStatus", "bad-status", "DONE", false},
			{"DeliveredRowKept", "delivered", "SUCCESS", false},
			{"FailedRowStillDue", "failed-due", "FAILED", true},
			{"PendingRowNeverDue", "pending-never", "PENDING", false},
		} {
			if err := insert(int64(i+2), c.key, c.status, c.due); err == nil {
				t.Errorf("%s: insert succeeded, want a constraint violation", c.name)
			}
		}
		// forward_records is a view for reading: writes go to the tables.
		if _, err := pool.Exec(ctx, "UPDATE forward_records SET status = 'PENDING'"); err == nil {
			t.Error("an update of the view forward_records succeeded")
		}
	})
}

func TestEnsureSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MigratesAnEmptyDatabaseOnce", func(t *testing.T) {
		t.Parallel()
		pool := openEmpty(t)
		if err := outboxdb.EnsureSchema(ctx, pool, nil); err != nil {
			t.Fatal(err)
		}
		v, err := outboxdb.SchemaVersion(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if v != outboxdb.LatestVersion() {
			t.Fatalf("schema version %d after EnsureSchema, want %d", v, outboxdb.LatestVersion())
		}
		// Remembered for the process: a second call does not run Migrate,
		// so a newer version recorded meanwhile goes unnoticed here.
		if _, err := pool.Exec(ctx, "INSERT INTO forwarder_schema_migrations (version, name) VALUES (9999, 'x')"); err != nil {
			t.Fatal(err)
		}
		if err := outboxdb.EnsureSchema(ctx, pool, nil); err != nil {
			t.Fatalf("second call: %v", err)
		}
	})

	t.Run("RefusesNewerSchema", func(t *testing.T) {
		t.Parallel()
		pool := openEmpty(t)
		if _, err := outboxdb.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "INSERT INTO forwarder_schema_migrations (version, name) VALUES (9999, 'x')"); err != nil {
			t.Fatal(err)
		}
		err := outboxdb.EnsureSchema(ctx, pool, nil)
		if !errors.Is(err, outboxdb.ErrSchemaTooNew) {
			t.Fatalf("err = %v, want ErrSchemaTooNew", err)
		}
	})
}

// TestUpgradeClassifiesFailedRows migrates a database left at version 2 with
// FAILED rows of every kind: each must get the failure class that decides
// whether compensation and requeue may send it again.
func TestUpgradeClassifiesFailedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openEmpty(t)
	ms, err := outboxdb.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	migrateTo(t, pool, ms[:2])
	failed := func(key string, attempts int, lastError, errcode string) {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO forward_records
			(message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, status, attempt_count, next_retry_at, last_error)
			VALUES ($1, 'VEHICLE_EVENT', 't', 0, 0, '\x7b7d', 'FAILED', $2, NULL, $3) RETURNING id`, key, attempts, lastError).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if errcode != "" {
			if _, err := pool.Exec(ctx, `INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, platform_errcode)
				VALUES ($1, $2, 'FAILED', $3)`, id, attempts, errcode); err != nil {
				t.Fatal(err)
			}
		}
	}
	failed("bad-json", 0, "payload is not valid JSON", "")
	failed("mapping", 1, "mapping: inoutType 7 is not 0 or 1", "")
	failed("rejected", 1, "not retried (rules[1] no_retry): http 200", "998")
	failed("exhausted", 5, "giving up after 5 attempts: http 503", "")

	if _, err := outboxdb.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bad-json": "INVALID", "mapping": "INVALID", "rejected": "REJECTED", "exhausted": "TRANSIENT"}
	for key, class := range want {
		var got *string
		var failedAt *time.Time
		if err := pool.QueryRow(ctx, `SELECT failure_class, failed_at FROM forward_records WHERE message_key = $1`, key).Scan(&got, &failedAt); err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != class || failedAt == nil {
			t.Errorf("%s: failure_class %v, failed_at %v; want %s and a time", key, got, failedAt, class)
		}
	}
}

// migrateTogether runs migrate n times at once, as n instances starting
// together would, and returns each run's error and how many migrations they
// applied in all.
func migrateTogether(n int, migrate func() (outboxdb.MigrateResult, error)) (errs []error, applied int) {
	errs = make([]error, n)
	counts := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := migrate()
			errs[i], counts[i] = err, len(res.Applied)
		})
	}
	wg.Wait()
	for _, c := range counts {
		applied += c
	}
	return errs, applied
}
