package outboxdb_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

type gaugesTestBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setupGaugesTest(t *testing.T) *gaugesTestBundle {
	t.Helper()
	return &gaugesTestBundle{ctx: context.Background(), pool: pgtest.NewPool(t)}
}

// insert adds n rows in status; unfinished rows are due dueIn from now (the
// lease deadline for IN_PROGRESS). It flushes the backend's statistics so
// that the live-row count includes the rows.
func (b *gaugesTestBundle) insert(t *testing.T, prefix, status string, n int, dueIn time.Duration) {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `WITH m AS (
		INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
		SELECT $1 || '-' || g, 'VEHICLE_EVENT', 'device-vehicle-event', 0, g, convert_to('{"n":' || g || '}', 'UTF8')
		FROM generate_series(1, $3::integer) g
		RETURNING id, created_at, message_key, payload
	)
	INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, next_retry_at, payload_size,
	                                failure_class, failed_at)
	SELECT id, created_at, message_key, $2, 1,
	       CASE WHEN $2 IN ('PENDING', 'IN_PROGRESS') THEN now() + $4 * interval '1 millisecond' END,
	       octet_length(payload), CASE WHEN $2 = 'FAILED' THEN 'TRANSIENT' END, CASE WHEN $2 = 'FAILED' THEN now() END
	FROM m
	WHERE $2 <> 'SUCCESS'`, prefix, status, n, dueIn.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	// Reported when the backend goes idle, before it answers this call.
	if _, err := conn.Exec(b.ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
}

// exactCounts is the naive query the gauges must agree with.
func (b *gaugesTestBundle) exactCounts(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, "SELECT status, count(*) FROM forward_records GROUP BY status")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	counts := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		counts[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

func (b *gaugesTestBundle) read(t *testing.T, opts outboxdb.GaugeOptions) outboxdb.RecordGauges {
	t.Helper()
	g, err := outboxdb.ReadRecordGauges(b.ctx, b.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (b *gaugesTestBundle) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestRecordGauges(t *testing.T) {
	t.Parallel()

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		g := b.read(t, outboxdb.GaugeOptions{})
		if g.Pending != 0 || g.InProgress != 0 || g.Success != 0 || g.Failed != 0 || g.OldestDueAge != 0 {
			t.Errorf("gauges of an empty table: %+v", g)
		}
		if g.SuccessSource != outboxdb.SuccessExact {
			t.Errorf("source %q, want exact on a small table", g.SuccessSource)
		}
	})

	t.Run("ExactCountsMatchGroupBy", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		b.insert(t, "p", "PENDING", 3, -90*time.Second)
		b.insert(t, "i", "IN_PROGRESS", 2, time.Minute)
		b.insert(t, "f", "FAILED", 4, 0)
		b.insert(t, "s", "SUCCESS", 5, 0)

		g := b.read(t, outboxdb.GaugeOptions{})
		want := b.exactCounts(t)
		if g.Pending != want["PENDING"] || g.InProgress != want["IN_PROGRESS"] ||
			g.Success != want["SUCCESS"] || g.Failed != want["FAILED"] {
			t.Errorf("gauges %+v, want %v", g, want)
		}
		if g.SuccessSource != outboxdb.SuccessExact {
			t.Errorf("source %q, want exact", g.SuccessSource)
		}
		if g.OldestDueAge < 90*time.Second || g.OldestDueAge > time.Hour {
			t.Errorf("oldest due age %v, want the 90 s the PENDING rows have been due", g.OldestDueAge)
		}
	})

	t.Run("OldestDueAge", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		// Waiting for a retry, or leased to a live holder: not due, not late.
		b.insert(t, "p", "PENDING", 2, time.Minute)
		b.insert(t, "i", "IN_PROGRESS", 2, time.Minute)
		if g := b.read(t, outboxdb.GaugeOptions{}); g.OldestDueAge != 0 {
			t.Errorf("oldest due age %v with nothing due, want 0", g.OldestDueAge)
		}
		// A lease that ran out 30 s ago is a row waiting for a dispatcher.
		b.insert(t, "x", "IN_PROGRESS", 1, -30*time.Second)
		if g := b.read(t, outboxdb.GaugeOptions{}); g.OldestDueAge < 30*time.Second || g.OldestDueAge > time.Hour {
			t.Errorf("oldest due age %v, want the 30 s since the lease expired", g.OldestDueAge)
		}
	})

	t.Run("SuccessFromStatistics", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		b.insert(t, "s", "SUCCESS", 3000, 0)
		b.insert(t, "p", "PENDING", 7, 0)
		b.insert(t, "f", "FAILED", 11, 0)
		// Status changes do not move the live-row count; SUCCESS follows them
		// through the exact unfinished counts.
		b.exec(t, "DELETE FROM forward_deliveries WHERE message_key = 'p-1'") // delivered
		want := b.exactCounts(t)

		// The inserting backends report their statistics when they go idle.
		deadline := time.Now().Add(30 * time.Second)
		for {
			g := b.read(t, outboxdb.GaugeOptions{ExactSuccessMaxPages: -1})
			if g.SuccessSource != outboxdb.SuccessStats {
				t.Fatalf("source %q, want stats", g.SuccessSource)
			}
			if g.Success == want["SUCCESS"] && g.Pending == want["PENDING"] && g.Failed == want["FAILED"] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gauges %+v never matched %v", g, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("SuccessFromPlannerAfterStatisticsReset", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		b.insert(t, "s", "SUCCESS", 4000, 0)
		b.insert(t, "f", "FAILED", 5, 0)
		b.exec(t, "ANALYZE forward_messages, forward_deliveries")
		// What a crash does to the statistics: the live-row counts restart
		// from zero and the partitions look never vacuumed nor analysed.
		b.exec(t, `SELECT pg_stat_reset_single_table_counters(i.inhrelid)
			FROM pg_inherits i WHERE i.inhparent = 'forward_messages'::regclass`)
		want := b.exactCounts(t)

		g := b.read(t, outboxdb.GaugeOptions{ExactSuccessMaxPages: -1})
		if g.SuccessSource != outboxdb.SuccessPlanner {
			t.Fatalf("source %q, want planner", g.SuccessSource)
		}
		if diff := math.Abs(float64(g.Success-want["SUCCESS"])) / float64(want["SUCCESS"]); diff > 0.01 || g.Failed != want["FAILED"] {
			t.Errorf("gauges %+v, want SUCCESS within 1%% of %v", g, want)
		}
	})

	t.Run("NeverReadsSuccessRows", func(t *testing.T) {
		t.Parallel()
		b := setupGaugesTest(t)
		b.insert(t, "s", "SUCCESS", 100_000, 0)
		b.insert(t, "p", "PENDING", 10, 0)
		b.insert(t, "f", "FAILED", 10, 0)
		b.exec(t, "ANALYZE forward_messages, forward_deliveries")

		rows, err := b.pool.Query(b.ctx, "EXPLAIN "+outboxdb.RecordGaugesSQL())
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		p := plan.String()
		// Delivered messages are rows of forward_messages only: the gauge
		// query counts the delivery rows and reads the partitions' sizes,
		// never a message.
		if strings.Contains(p, "forward_messages_p") || !strings.Contains(p, "on forward_deliveries") {
			t.Errorf("the gauge query must read forward_deliveries and statistics only:\n%s", p)
		}
		g := b.read(t, outboxdb.GaugeOptions{})
		if g.SuccessSource == outboxdb.SuccessExact {
			t.Errorf("SUCCESS counted exactly on a %d-row table", 100_000)
		}
	})
}
