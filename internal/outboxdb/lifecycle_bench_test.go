package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
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
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkRowLifecycle -count 5
func BenchmarkRowLifecycle(b *testing.B) {
	const batch = 300
	lease := outboxdb.DirectClaim{Limit: batch, Lease: time.Minute, Claimer: "bench"}
	claim := outboxdb.ClaimParams{Limit: batch, Lease: time.Minute, Claimer: "bench", MaxAttempts: 5}
	paths := []struct {
		name string
		// deliver inserts recs and returns their claims.
		deliver func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.ClaimedRow, error)
	}{
		{"backlog", func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.ClaimedRow, error) {
			if _, err := outboxdb.InsertBatchCount(ctx, tb.Pool, recs); err != nil {
				return nil, err
			}
			res, err := outboxdb.ClaimDue(ctx, tb.Pool, claim)
			return res.Claimed, err
		}},
		{"direct", func(ctx context.Context, tb *fixture.DB, recs []outboxdb.NewRecord) ([]outboxdb.ClaimedRow, error) {
			_, claimed, err := outboxdb.InsertBatchClaim(ctx, tb.Pool, recs, lease)
			return claimed, err
		}},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			tb := setupClaimTest(b)
			recs := make([]outboxdb.NewRecord, batch)
			results := make([]outboxdb.Result, 0, batch)
			b.ResetTimer()
			for i := range b.N {
				for j := range recs {
					recs[j] = lifecycleRecord(i*batch + j)
				}
				claimed, err := p.deliver(tb.Ctx, tb, recs)
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
		})
	}
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
