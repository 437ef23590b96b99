package prometheus

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// benchRowsEnv adds a run at that many finished rows to
// BenchmarkOutboxGaugesRefresh, e.g. FORWARDER_BENCH_ROWS=10000000 (the
// bulk load takes a few minutes and about 4 GB of disk).
const benchRowsEnv = "FORWARDER_BENCH_ROWS"

// BenchmarkOutboxGaugesRefresh measures one refresh of the record gauges
// (runOnce: the queries and their round trips) next to a typical backlog,
// at 0 finished rows and, with FORWARDER_BENCH_ROWS, at that many. It also
// reports the naive GROUP BY count it replaces (naive_ms) and the error of
// the SUCCESS gauge against the exact count (success_err_%).
//
//	FORWARDER_BENCH_ROWS=10000000 go test -run '^$' -bench OutboxGaugesRefresh -benchtime 200x ./plugins/prometheus/
func BenchmarkOutboxGaugesRefresh(b *testing.B) {
	sizes := []int{0}
	if s := os.Getenv(benchRowsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: want a row count", benchRowsEnv, s)
		}
		sizes = append(sizes, n)
	}
	for _, finished := range sizes {
		b.Run(fmt.Sprintf("finished=%d", finished), func(b *testing.B) {
			ctx := context.Background()
			dsn := pgtest.NewDB(b)
			pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			bulkLoadSuccess(b, pool, finished)
			insertRows(b, pool, "p", "PENDING", 100, -time.Second)
			insertRows(b, pool, "i", "IN_PROGRESS", 10, time.Minute)
			insertRows(b, pool, "f", "FAILED", 1000, 0)
			// What autovacuum does after a bulk load.
			if _, err := pool.Exec(ctx, "VACUUM ANALYZE forward_messages, forward_deliveries, forward_retry_logs"); err != nil {
				b.Fatal(err)
			}

			poolCfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{MaxConns: 1})
			if err != nil {
				b.Fatal(err)
			}
			o := newOutboxGauges(outboxGaugesConfig{RefreshInterval: time.Hour}, poolCfg, nil)
			defer o.stop()
			if _, err := o.runOnce(ctx); err != nil { // opens the pool
				b.Fatal(err)
			}

			var res refreshResult
			for b.Loop() {
				if res, err = o.runOnce(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/refresh")
			b.ReportMetric(0, "ns/op") // ms/refresh says it

			start := time.Now()
			exact := countsByStatus(b, pool)
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "naive_ms")
			errPct := 0.0
			if exact["SUCCESS"] > 0 {
				errPct = math.Abs(float64(res.Gauges.Success)-exact["SUCCESS"]) / exact["SUCCESS"] * 100
			}
			b.ReportMetric(errPct, "success_err_%")
			if float64(res.Gauges.Pending) != exact["PENDING"] || float64(res.Gauges.Failed) != exact["FAILED"] {
				b.Errorf("gauges %+v, want %v", res.Gauges, exact)
			}
			b.Logf("finished=%d: SUCCESS %d (%s) vs exact %.0f", finished, res.Gauges.Success, res.Gauges.SuccessSource, exact["SUCCESS"])
		})
	}
}

// bulkLoadSuccess inserts n messages delivered a day ago with
// camera-event-sized payloads, each with its SUCCESS attempt, a million per
// statement.
func bulkLoadSuccess(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), `SELECT forward_partition_ensure(now() - interval '2 days', now(), interval '1 day')`); err != nil {
		b.Fatal(err)
	}
	const chunk = 1_000_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := pool.Exec(context.Background(), `WITH m AS (
			INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, created_at)
			SELECT 'done-' || g, 'VEHICLE_EVENT', 'device-vehicle-event', g % 12, g,
			       convert_to(rpad('{"messageId":"' || g || '"', 400, ' ') || '}', 'UTF8'), now() - interval '1 day'
			FROM generate_series($1::bigint, $2::bigint) g
			RETURNING id, created_at
			)
			INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status, attempted_at)
			SELECT id, created_at, 1, 'SUCCESS', 200, created_at FROM m`, lo, hi); err != nil {
			b.Fatalf("bulk-loading rows %d-%d: %v", lo, hi, err)
		}
	}
}
