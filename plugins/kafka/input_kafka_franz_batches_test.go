package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The batches the input hands out, driven without a broker: the test plays
// the poll loop (adding records) and the rebalance callbacks.

// fetchTestInput is a kafka_franz input that is never connected; extra
// config lines are appended.
func fetchTestInput(t *testing.T, extra string) *franzInput {
	t.Helper()
	f := newInput(t, "seed_brokers: [ a:1 ]\ntopics: [ t ]\nconsumer_group: g\n"+extra, nil)
	f.budget = &byteBudget{limit: f.maxBufferedBytes} // as Connect does
	return f
}

// fetch plays the poll loop: partition p of topic t receives offsets
// from..to, and its state is returned.
func (f *franzInput) fetch(p int32, from, to int64) *partitionState {
	f.mu.Lock()
	defer f.mu.Unlock()
	tp := topicPartition{"t", p}
	ps := f.parts[tp]
	if ps == nil {
		ps = newPartitionState(tp, f.budget)
		f.parts[tp] = ps
	}
	var recs []*kgo.Record
	for o := from; o <= to; o++ {
		recs = append(recs, &kgo.Record{Topic: "t", Partition: p, Offset: o, Value: fmt.Appendf(nil, "%d/%d", p, o)})
	}
	ps.add(buildMessages(recs, 1<<30))
	return ps
}

// take is one step of the reader: the batch the input hands out now, nil
// when it has none.
func (f *franzInput) take(t *testing.T) (service.MessageBatch, service.AckFunc) {
	t.Helper()
	f.readerMu.Lock()
	defer f.readerMu.Unlock()
	batch, ack, _, err := f.nextBatch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return batch, ack
}

// revoke plays a rebalance that takes partition p away.
func (f *franzInput) revoke(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLocked(map[string][]int32{"t": {p}})
}

// batchRecords lists the records of a batch, in order.
func batchRecords(t *testing.T, b service.MessageBatch) []offsetKey {
	t.Helper()
	out := make([]offsetKey, len(b))
	for i, m := range b {
		out[i] = msgOffset(t, m)
	}
	return out
}

// span lists offsets from..to of partition p of topic t.
func span(p int32, from, to int64) []offsetKey {
	var out []offsetKey
	for o := from; o <= to; o++ {
		out = append(out, offsetKey{"t", p, o})
	}
	return out
}

// byPartition sorts records by partition, then offset: the order of the
// partitions in a batch is the map's, which is random.
func byPartition(recs []offsetKey) []offsetKey {
	out := slices.Clone(recs)
	slices.SortFunc(out, func(a, b offsetKey) int {
		return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
	})
	return out
}

func TestFetchBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rejected := errors.New("rejected by test")

	// Without a batching policy, as in configs written for Connect's
	// kafka_franz, which needs none.
	t.Run("OneBatchCarriesEveryPartitionAndItsAckCommitsEach", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "")
		p0, p1, p2 := f.fetch(0, 0, 4), f.fetch(1, 0, 2), f.fetch(2, 10, 11)

		batch, ack := f.take(t)
		got := byPartition(batchRecords(t, batch))
		want := slices.Concat(span(0, 0, 4), span(1, 0, 2), span(2, 10, 11))
		if !slices.Equal(got, want) {
			t.Fatalf("batch holds %v, want %v", got, want)
		}
		if b, _ := f.take(t); b != nil {
			t.Fatalf("a second batch of %d records; everything was in the first", len(b))
		}
		for _, ps := range []*partitionState{p0, p1, p2} {
			wantCommit(t, ps, -1)
		}

		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
		wantCommit(t, p0, 5)
		wantCommit(t, p1, 3)
		wantCommit(t, p2, 12)
		for _, ps := range []*partitionState{p0, p1, p2} {
			if n := ps.tracked(); n != 0 {
				t.Errorf("partition %d still holds %d records after the ack", ps.tp.partition, n)
			}
		}
	})

	// A policy groups what the same steps take: a batch only when it
	// triggers, and what waits in it stays in flight.
	t.Run("APolicyGroupsWhatIsTaken", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "batching:\n  count: 4")
		p0 := f.fetch(0, 0, 5)
		b, ack := f.take(t)
		if got := batchRecords(t, b); !slices.Equal(got, span(0, 0, 3)) {
			t.Fatalf("first batch %v, want the policy's count of 4", got)
		}
		if more, _ := f.take(t); more != nil {
			t.Fatalf("a batch of %d records before the policy triggered", len(more))
		}
		f.fetch(1, 0, 1)
		rest, ack2 := f.take(t)
		if got := byPartition(batchRecords(t, rest)); !slices.Equal(got, slices.Concat(span(0, 4, 5), span(1, 0, 1))) {
			t.Fatalf("second batch %v, want p0's last two and p1's two", got)
		}
		_ = ack(ctx, nil)
		_ = ack2(ctx, nil)
		wantCommit(t, p0, 6)
	})

	// pipelines/forwarder.yaml's policy: a period, counted from the last
	// flush. What arrives within it waits for it, unless nothing more could
	// join the batch.
	t.Run("APeriodHoldsWhatArrivesWithinIt", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "checkpoint_limit: 4\nbatching:\n  period: 1h")
		p0 := f.fetch(0, 0, 2)
		if b, _ := f.take(t); b != nil {
			t.Fatalf("a batch of %d records within the period", len(b))
		}
		if p0.handed != 3 {
			t.Fatalf("%d records of p0 wait in the policy's batch, want 3", p0.handed)
		}
		// p0 reaches checkpoint_limit: nothing more of it can join
		// until the batch is acked, so the batch goes now.
		f.fetch(0, 3, 5)
		b, ack := f.take(t)
		if got := batchRecords(t, b); !slices.Equal(got, span(0, 0, 3)) {
			t.Fatalf("batch %v, want p0's first four (its checkpoint_limit)", got)
		}
		_ = ack(ctx, nil)
		wantCommit(t, p0, 4)
	})

	// `period: 0s` (KAFKA_BATCH_PERIOD=0) is a policy Benthos accepts but
	// whose period never ends: it would hold records until a partition
	// reached checkpoint_limit, at a low rate for ever. It means "do not
	// wait".
	t.Run("AZeroPeriodFlushesAtOnce", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "batching:\n  period: 0s")
		p0 := f.fetch(0, 0, 1)
		b, ack := f.take(t)
		if got := batchRecords(t, b); !slices.Equal(got, span(0, 0, 1)) {
			t.Fatalf("batch %v, want both records at once", got)
		}
		_ = ack(ctx, nil)
		wantCommit(t, p0, 2)
	})

	t.Run("BoundedByCheckpointLimit", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "checkpoint_limit: 4")
		p0, p1 := f.fetch(0, 0, 5), f.fetch(1, 0, 1)

		// Without acks: no batch above checkpoint_limit records, and no
		// partition with more than checkpoint_limit records in flight.
		var acks []service.AckFunc
		for {
			b, ack := f.take(t)
			if b == nil {
				break
			}
			if len(b) > 4 {
				t.Fatalf("batch of %d records, above checkpoint_limit 4", len(b))
			}
			acks = append(acks, ack)
		}
		if p0.handed != 4 || p1.handed != 2 {
			t.Fatalf("in flight p0=%d p1=%d, want 4 (the limit) and 2 (all it has)", p0.handed, p1.handed)
		}
		for _, ack := range acks {
			_ = ack(ctx, nil)
		}
		rest, ack := f.take(t)
		if got := batchRecords(t, rest); !slices.Equal(got, span(0, 4, 5)) {
			t.Fatalf("after the acks the batch holds %v, want p0's last two", got)
		}
		_ = ack(ctx, nil)
		wantCommit(t, p0, 6)
		wantCommit(t, p1, 2)
	})

	t.Run("BoundedByTheByteBudget", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "max_buffered_bytes: 10B")
		p0 := f.fetch(0, 0, 5) // values "0/0" … "0/5": 3 bytes each
		b, ack := f.take(t)
		if got := batchRecords(t, b); !slices.Equal(got, span(0, 0, 2)) {
			t.Fatalf("batch holds %v under a 10-byte budget, want the first three 3-byte records", got)
		}
		if more, _ := f.take(t); more != nil {
			t.Fatalf("a second batch of %d records while the budget is full", len(more))
		}
		_ = ack(ctx, nil)
		wantCommit(t, p0, 3)
		rest, _ := f.take(t)
		if got := batchRecords(t, rest); !slices.Equal(got, span(0, 3, 5)) {
			t.Fatalf("after the ack the batch holds %v, want the last three", got)
		}
	})

	t.Run("ARejectionLeavesEveryShareUnacked", func(t *testing.T) {
		t.Parallel()
		// AutoRetryNacksBatched delivers a rejected batch again and
		// acks only then; an error reaching the input (the stream gave
		// up as it stopped) must not count as delivered.
		f := fetchTestInput(t, "")
		p0, p1 := f.fetch(0, 0, 2), f.fetch(1, 5, 6)
		_, nack := f.take(t)
		if err := nack(ctx, rejected); err != nil {
			t.Fatal(err)
		}
		wantCommit(t, p0, -1)
		wantCommit(t, p1, -1)
		if p0.handed != 3 || p1.handed != 2 {
			t.Fatalf("after the rejection p0 has %d records in flight, p1 %d; want 3 and 2", p0.handed, p1.handed)
		}
	})

	t.Run("RevokedShareIsNotCommitted", func(t *testing.T) {
		t.Parallel()
		f := fetchTestInput(t, "")
		p0 := f.fetch(0, 0, 2)
		f.fetch(1, 0, 2)
		batch, ack := f.take(t)
		if len(batch) != 6 {
			t.Fatalf("batch of %d records, want both partitions' 6", len(batch))
		}

		// p1 moves away and comes back while the batch is in flight:
		// the new assignment starts again from the last commit (none).
		f.revoke(1)
		p1 := f.fetch(1, 0, 2)

		_ = ack(ctx, nil)
		wantCommit(t, p0, 3)
		wantCommit(t, p1, -1)
		if p1.tracked() != 3 {
			t.Fatalf("the new assignment of p1 holds %d records, want its own 3", p1.tracked())
		}
		// p1's records are handed out again under the new assignment.
		b, ack2 := f.take(t)
		if got := batchRecords(t, b); !slices.Equal(got, span(1, 0, 2)) {
			t.Fatalf("next batch %v, want p1's records again", got)
		}
		_ = ack2(ctx, nil)
		wantCommit(t, p1, 3)
	})
}
