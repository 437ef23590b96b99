package outboxretry

import (
	"context"
	"fmt"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// BenchmarkReadBatch measures the input end to end at batch_size 500: claim,
// build the messages with their metadata, ack. claims/s is rows claimed per
// second by one input.
//
//	go test ./plugins/outboxretry -run '^$' -bench ReadBatch
func BenchmarkReadBatch(b *testing.B) {
	const batch = 500
	tb := setup(b)
	in := tb.input(b, fmt.Sprintf("batch_size: %d\nmax_unacked: %d", batch, 2*batch))
	ctx := context.Background()
	b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
		tb.insertDue(b, b.N*batch)
		if _, err := tb.pool.Exec(ctx, "VACUUM (ANALYZE) forward_messages, forward_deliveries"); err != nil {
			b.Fatal(err)
		}
		claimed := 0
		b.ResetTimer()
		for range b.N {
			msgs, ack, err := in.ReadBatch(ctx)
			if err != nil {
				b.Fatal(err)
			}
			claimed += len(msgs)
			if err := ack(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if claimed != b.N*batch {
			b.Fatalf("claimed %d rows, want %d", claimed, b.N*batch)
		}
		b.ReportMetric(float64(claimed)/b.Elapsed().Seconds(), "claims/s")
		if _, err := fixture.Deliver(ctx, tb.pool, "status = 'IN_PROGRESS'"); err != nil {
			b.Fatal(err)
		}
	})
}
