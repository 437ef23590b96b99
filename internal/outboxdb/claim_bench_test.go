package outboxdb_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// BenchmarkClaim measures one claim statement with 0 and 1 M finished
// (SUCCESS) rows in the table, at batch sizes 100 and 500. ns/op is the time
// of one claim; claims/s is rows claimed per second by one claimer. The two
// table sizes should give about the same figures: the claim reads only the
// partial due index.
//
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkClaim
func BenchmarkClaim(b *testing.B) {
	for _, finished := range []int{0, 1_000_000} {
		tb := setupClaimTest(b)
		if finished > 0 {
			fixture.New(b, tb.Pool).InsertFinished(finished)
		}
		var keys int
		for _, batch := range []int{100, 500} {
			b.Run(fmt.Sprintf("finished=%d/batch=%d", finished, batch), func(b *testing.B) {
				// A due backlog big enough for every iteration, fresh
				// statistics, and no dead rows left by the previous run.
				keys++
				tb.InsertDue(fmt.Sprintf("bench-%d-%d", batch, keys), b.N*batch)
				claimFull(b, tb, batch, "")
				// Finish what was claimed, as the output would.
				if _, err := tb.Pool.Exec(tb.Ctx, `DELETE FROM forward_deliveries WHERE status = 'IN_PROGRESS'`); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkClaimWithHotKey measures one claim of 100 rows of other keys
// while one ordering key has 0 or 100 000 rows held behind its head (a
// berth whose head keeps failing, say). The two should give about the same
// figures: held rows are not in the claim's index at all, so a long queue
// behind one key costs the claims of every other key nothing.
//
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkClaimWithHotKey
func BenchmarkClaimWithHotKey(b *testing.B) {
	const batch = 100
	for _, held := range []int{0, 100_000} {
		tb := setupClaimTest(b)
		tb.Insert(fixture.Row{Key: "hot-head", Status: "IN_PROGRESS", OrderingKey: "P0001/B-001"})
		if held > 0 {
			tb.InsertHeld("P0001/B-001", held)
		}
		runs := 0
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			runs++ // b.Run may call this more than once
			tb.InsertDue(fmt.Sprintf("other-%d", runs), b.N*batch)
			claimFull(b, tb, batch, ": a held row was claimed, or a due one missed")
		})
	}
}

// claimFull vacuums and analyzes forward_records, then times b.N claims of
// batch rows from the due backlog the caller inserted, and reports claims/s.
// Every claim must come back full; why ends the failure message.
func claimFull(b *testing.B, tb *fixture.DB, batch int, why string) {
	b.Helper()
	if _, err := tb.Pool.Exec(tb.Ctx, "VACUUM (ANALYZE) forward_deliveries, forward_messages"); err != nil {
		b.Fatal(err)
	}
	p := outboxdb.ClaimParams{Limit: batch, Lease: time.Minute, Claimer: "bench", MaxAttempts: 5}
	claimed := 0
	b.ResetTimer()
	for range b.N {
		res, err := outboxdb.ClaimDue(tb.Ctx, tb.Pool, p)
		if err != nil {
			b.Fatal(err)
		}
		claimed += len(res.Claimed)
	}
	b.StopTimer()
	if claimed != b.N*batch {
		b.Fatalf("claimed %d rows, want %d%s", claimed, b.N*batch, why)
	}
	b.ReportMetric(float64(claimed)/b.Elapsed().Seconds(), "claims/s")
}
