package outboxdb_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// BenchmarkRowLifecycle measures PostgreSQL's share of one delivered message
// on each of the two paths a row can take, in batches of 300 on one
// connection (rows/s is whole lifecycles per second):
//
//   - backlog: inserted PENDING, claimed later, result recorded. Every row
//     the dispatcher has no room for takes this path: three row versions.
//   - direct: inserted already claimed (direct dispatch), result recorded:
//     two row versions, as in a loop that delivers before it ingests more.
//
// The ratio of the two is what the claim costs; docs/benchmarks.md uses it.
//
// Each path runs on the two kinds of pool the service opens
// (outboxdb.PoolConfig): conn=direct, named prepared statements (pgx's
// default) with NoSeqScan, as on a direct connection; conn=pooled, unnamed
// statements whose descriptions pgx caches, as behind PgBouncer (Pooled).
// conn=exec is pgx's other pooler-safe mode (QueryExecModeExec: text
// parameters and results, nothing cached), for comparison. The ratio of
// pooled to direct is what PgBouncer's transaction pooling costs the
// database and the client (docs/benchmarks.md). Besides rows/s, which
// moves with whatever else the machine runs, it reports CPU time per row:
// pg-µs/row of the pool's one server process (read from /proc, when the
// server runs on this machine) and go-µs/row of this process.
//
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkRowLifecycle -count 5
func BenchmarkRowLifecycle(b *testing.B) {
	const batch = 300
	lease := outboxdb.DirectClaim{Limit: batch, Lease: time.Minute, Claimer: "bench"}
	claim := outboxdb.ClaimParams{Limit: batch, Lease: time.Minute, Claimer: "bench", MaxAttempts: 5}
	paths := []struct {
		name string
		// deliver inserts recs and returns their claims.
		deliver func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.Record, error)
	}{
		{"backlog", func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.Record, error) {
			if _, err := outboxdb.InsertBatchCount(ctx, tb.Pool, recs); err != nil {
				return nil, err
			}
			res, err := outboxdb.ClaimDue(ctx, tb.Pool, claim)
			return res.Claimed, err
		}},
		{"direct", func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.Record, error) {
			_, claimed, err := outboxdb.InsertBatchClaim(ctx, tb.Pool, recs, lease)
			return claimed, err
		}},
	}
	conns := []struct {
		name, dsnSuffix string
		cfg             outboxdb.PoolConfig
	}{
		{"direct", "", outboxdb.PoolConfig{NoSeqScan: true}},
		{"pooled", "", outboxdb.PoolConfig{Pooled: true}},
		{"exec", "default_query_exec_mode=exec", outboxdb.PoolConfig{Pooled: true}},
	}
	for _, p := range paths {
		for _, c := range conns {
			b.Run(p.name+"/conn="+c.name, func(b *testing.B) {
				tb := fixture.New(b, openBenchPool(b, c.dsnSuffix, c.cfg))
				lifecycleLoop(b, tb, p.deliver, 0)
			})
		}
	}
}

// BenchmarkOrderedRowLifecycle is BenchmarkRowLifecycle's direct path on a
// direct connection with every row carrying an ordering key (ORDERING=berth)
// or none (ORDERING=off). The keys cycle through 5 000 000, so no key comes
// twice in a run shorter than that and no row is ever held: the difference
// is what ordering costs a row that waits for nothing (the key locks, the
// active-row and successor probes, the ordering indexes). docs/benchmarks.md,
// "The result write's successor probe", has each statement's share.
//
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkOrderedRowLifecycle -count 5
func BenchmarkOrderedRowLifecycle(b *testing.B) {
	lease := outboxdb.DirectClaim{Limit: 300, Lease: time.Minute, Claimer: "bench"}
	deliver := func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.Record, error) {
		_, claimed, err := outboxdb.InsertBatchClaim(ctx, tb.Pool, recs, lease)
		return claimed, err
	}
	for _, keys := range []int{0, 5_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			tb := fixture.New(b, openBenchPool(b, "", outboxdb.PoolConfig{NoSeqScan: true}))
			lifecycleLoop(b, tb, deliver, keys)
		})
	}
}

// openBenchPool opens a pool with cfg on a fresh migrated database whose
// URL gets suffix as one more query parameter.
func openBenchPool(b *testing.B, suffix string, cfg outboxdb.PoolConfig) *pgxpool.Pool {
	b.Helper()
	dsn := pgtest.NewDB(b)
	if suffix != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + suffix
	}
	cfg.MaxConns = 1 // one server process, whose CPU time is measured
	pool, err := outboxdb.Open(context.Background(), dsn, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// lifecycleLoop delivers b.N batches of new rows with deliver and records
// their results. With keys > 0 the rows carry ordering keys, cycling
// through that many.
func lifecycleLoop(b *testing.B, tb *fixture.DB, deliver func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.Record, error), keys int) {
	const batch = 300
	recs := make([]outboxdb.NewRecord, batch)
	results := make([]outboxdb.Result, 0, batch)
	var backend int
	if err := tb.Pool.QueryRow(tb.Ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	pgStart, pgErr := procCPU(backend)
	goStart := selfCPU()
	b.ResetTimer()
	for i := range b.N {
		for j := range recs {
			recs[j] = lifecycleRecord(i*batch + j)
			if keys > 0 {
				recs[j].OrderingKey = fmt.Sprintf("P%03d/B%05d", (i*batch+j)%keys%100, (i*batch+j)%keys)
			}
		}
		claimed, err := deliver(tb.Ctx, tb, recs)
		if err != nil {
			b.Fatal(err)
		}
		if len(claimed) != batch {
			b.Fatalf("claimed %d rows, want %d", len(claimed), batch)
		}
		results = results[:0]
		for _, r := range claimed {
			results = append(results, outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken,
				Status: outboxdb.StatusSuccess, Sent: true, Duration: time.Millisecond, HTTPStatus: 200})
		}
		recorded, err := outboxdb.RecordResults(tb.Ctx, tb.Pool, results, outboxdb.RecordOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(recorded) != batch {
			b.Fatalf("recorded %d results, want %d", len(recorded), batch)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
	rows := float64(b.N * batch)
	b.ReportMetric(float64((selfCPU()-goStart).Microseconds())/rows, "go-µs/row")
	if pgEnd, err := procCPU(backend); err == nil && pgErr == nil {
		b.ReportMetric(float64((pgEnd-pgStart).Microseconds())/rows, "pg-µs/row")
	}
}

// procCPU is the CPU time (user and system) of process pid, from
// /proc/<pid>/stat, in clock ticks of 10 ms.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// selfCPU is this process's CPU time, user and system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lifecyclePayload is a vehicle event of the usual size (~330 bytes).
var lifecyclePayload = []byte(`{"messageId":"` + strings.Repeat("a", 36) + `","deviceId":"dev-17","parkCode":"P001",` +
	`"berthCode":"B0042","plateNo":"粤B12345","plateColor":1,"inoutType":1,"inoutTime":1764475200123,` +
	`"plateCredible":0.97,"pictures":[{"picType":1,"picUrl":"pics/2026/11/30/dev-17/0001.jpg"}]}`)

func lifecycleRecord(n int) outboxdb.NewRecord {
	return outboxdb.NewRecord{
		MessageKey: fmt.Sprintf("life-%d", n), APIType: "VEHICLE_EVENT",
		KafkaTopic: "device-vehicle-event", KafkaPartition: int32(n % 3), KafkaOffset: int64(n),
		Payload: lifecyclePayload, Status: outboxdb.StatusPending,
	}
}
