package kafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// records returns fetched records of partition t/0, offsets from..to, with
// their messages.
func records(from, to int64) []fetched {
	var recs []*kgo.Record
	for o := from; o <= to; o++ {
		recs = append(recs, &kgo.Record{Topic: "t", Offset: o, LeaderEpoch: 1})
	}
	return buildMessages(recs)
}

// handOut takes n pending records and tracks them as one batch.
func handOut(t *testing.T, ps *partitionState, n int) *trackedBatch {
	t.Helper()
	recs := ps.take(n)
	if len(recs) != n {
		t.Fatalf("take(%d) returned %d records", n, len(recs))
	}
	first, last := recs[0].rec, recs[len(recs)-1].rec
	return ps.track(first.Offset, last.Offset, last.LeaderEpoch, n)
}

func wantCommit(t *testing.T, ps *partitionState, want int64) {
	t.Helper()
	eo, ok := ps.committable()
	switch {
	case want < 0 && ok:
		t.Fatalf("committable = %d, want nothing", eo.Offset)
	case want >= 0 && !ok:
		t.Fatalf("nothing committable, want %d", want)
	case want >= 0 && eo.Offset != want:
		t.Fatalf("committable = %d, want %d", eo.Offset, want)
	}
}

func TestPartitionState(t *testing.T) {
	t.Parallel()

	t.Run("OutOfOrderAcksHoldTheCommitPoint", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 9))
		var b [10]*trackedBatch
		for i := range b {
			b[i] = handOut(t, ps, 1)
		}
		for _, i := range []int{0, 1, 2} {
			ps.ack(b[i])
		}
		wantCommit(t, ps, 3)

		// Offset 5 (and later) acked before 3 and 4: the commit point
		// stays at 3.
		for _, i := range []int{5, 6, 7, 8, 9} {
			if ps.ack(b[i]) {
				t.Fatalf("ack of offset %d moved the commit point past unacked offset 3", i)
			}
		}
		wantCommit(t, ps, 3)
		if got := ps.tracked(); got != 7 {
			t.Fatalf("tracked = %d, want 7 (acked records behind a gap still count)", got)
		}

		ps.ack(b[4])
		wantCommit(t, ps, 3)
		ps.ack(b[3])
		wantCommit(t, ps, 10)
		if got := ps.tracked(); got != 0 {
			t.Fatalf("tracked = %d after every ack, want 0", got)
		}
	})

	t.Run("CommitPointCarriesLeaderEpoch", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		recs := records(0, 1)
		recs[1].rec.LeaderEpoch = 7
		ps.add(recs)
		ps.ack(handOut(t, ps, 2))
		eo, _ := ps.committable()
		if eo.Epoch != 7 || eo.Offset != 2 {
			t.Fatalf("committable = %+v, want epoch 7 offset 2", eo)
		}
	})

	t.Run("AckIsIdempotent", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 3))
		a, b := handOut(t, ps, 2), handOut(t, ps, 2)
		ps.ack(b)
		ps.ack(b)
		wantCommit(t, ps, -1)
		ps.ack(a)
		ps.ack(a)
		wantCommit(t, ps, 4)
		if got := ps.tracked(); got != 0 {
			t.Fatalf("tracked = %d, want 0", got)
		}
	})

	t.Run("CommittedIsNotCommittedAgain", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 0))
		ps.ack(handOut(t, ps, 1))
		wantCommit(t, ps, 1)
		ps.committed = 1
		wantCommit(t, ps, -1)
	})

	t.Run("RewindDropsLaterBatchesAndSeeks", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 11))
		a := handOut(t, ps, 3) // 0-2
		b := handOut(t, ps, 3) // 3-5, nacked
		c := handOut(t, ps, 3) // 6-8, in flight
		gen := ps.gen

		if !ps.rewind(b) {
			t.Fatal("rewind of an in-flight batch did nothing")
		}
		if ps.seekTo != 3 || ps.nextFetch != 3 || ps.gen == gen {
			t.Fatalf("after rewind seekTo=%d nextFetch=%d gen changed=%v, want 3, 3, true", ps.seekTo, ps.nextFetch, ps.gen != gen)
		}
		if got := ps.tracked(); got != 3 {
			t.Fatalf("tracked = %d, want 3 (only batch 0-2 is still held)", got)
		}
		if ps.ack(c) || ps.ack(b) {
			t.Fatal("acks of rewound batches must be ignored")
		}
		wantCommit(t, ps, -1)

		// Records fetched before the seek is applied are stale.
		if n := ps.add(records(9, 11)); n != 0 {
			t.Fatalf("added %d stale records while a seek is pending", n)
		}
		ps.seekTo = -1 // the poll loop applied the seek
		if n := ps.add(records(3, 5)); n != 3 {
			t.Fatalf("added %d re-fetched records, want 3", n)
		}
		b2 := handOut(t, ps, 3)
		ps.ack(b2)
		wantCommit(t, ps, -1) // 0-2 still unacked
		ps.ack(a)
		wantCommit(t, ps, 6)
	})

	t.Run("StaleDuplicatesAreDropped", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 4))
		if n := ps.add(records(3, 6)); n != 2 {
			t.Fatalf("added %d records, want 2 (offsets 5 and 6)", n)
		}
	})

	t.Run("DropIgnoresLateAcks", func(t *testing.T) {
		t.Parallel()
		ps := newPartitionState(topicPartition{"t", 0})
		ps.add(records(0, 1))
		b := handOut(t, ps, 2)
		ps.drop()
		if ps.ack(b) {
			t.Fatal("ack after drop moved the commit point")
		}
		wantCommit(t, ps, -1)
		if n := ps.add(records(2, 3)); n != 0 {
			t.Fatalf("added %d records to a dropped partition", n)
		}
	})
}
