package kafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// records returns fetched records of partition t/0, offsets from..to, with
// their messages.
func records(from, to int64) []fetched {
	return sizedRecords(from, to, 0)
}

// sizedRecords is records with values of size bytes.
func sizedRecords(from, to int64, size int) []fetched {
	var recs []*kgo.Record
	for o := from; o <= to; o++ {
		recs = append(recs, &kgo.Record{Topic: "t", Offset: o, LeaderEpoch: 1, Value: make([]byte, size)})
	}
	return buildMessages(recs, 1<<30)
}

// newTestPartition is partition t/0 with a byte budget of its own.
func newTestPartition(limit int64) *partitionState {
	return newPartitionState(topicPartition{"t", 0}, &byteBudget{limit: limit})
}

// handOut takes n pending records as one batch in flight.
func handOut(t *testing.T, ps *partitionState, n int) *trackedBatch {
	t.Helper()
	recs, b := ps.take(n)
	if len(recs) != n {
		t.Fatalf("take(%d) returned %d records", n, len(recs))
	}
	return b
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
		ps := newTestPartition(1 << 30)
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
		ps := newTestPartition(1 << 30)
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
		ps := newTestPartition(1 << 30)
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
		ps := newTestPartition(1 << 30)
		ps.add(records(0, 0))
		ps.ack(handOut(t, ps, 1))
		wantCommit(t, ps, 1)
		ps.committed = 1
		wantCommit(t, ps, -1)
	})

	t.Run("StaleDuplicatesAreDropped", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.add(records(0, 4))
		if n := ps.add(records(3, 6)); n != 2 {
			t.Fatalf("added %d records, want 2 (offsets 5 and 6)", n)
		}
	})

	// A transaction marker (the last offset a transactional producer's
	// commit or abort writes) stands for no message: the commit point
	// passes it when nothing before it is held.
	marker := func(offset int64) kgo.EpochOffset { return kgo.EpochOffset{Epoch: 1, Offset: offset + 1} }

	t.Run("MarkerIsPassedOnceTheRecordsBeforeItAreAcked", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.add(records(0, 3))
		ps.addMarker(marker(4))
		a := handOut(t, ps, 2)
		wantCommit(t, ps, -1)
		ps.ack(a)
		wantCommit(t, ps, 2)
		if !ps.ack(handOut(t, ps, 2)) {
			t.Fatal("the last ack did not move the commit point")
		}
		wantCommit(t, ps, 5)
		if ps.nextFetch != 5 {
			t.Fatalf("nextFetch = %d, want 5 (past the marker: the lag counts no record there)", ps.nextFetch)
		}
	})

	t.Run("MarkerAloneIsPassedAtOnce", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.addMarker(marker(3)) // an aborted transaction: offsets 0-2 never read
		wantCommit(t, ps, 4)
	})

	t.Run("MarkerBehindLaterRecordsIsNotWhereTheCommitGoes", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.add(records(0, 1))
		ps.addMarker(marker(2))
		a := handOut(t, ps, 2)
		ps.add(records(3, 4))
		b := handOut(t, ps, 2)
		ps.ack(b)
		wantCommit(t, ps, -1) // offsets 0-1 are not acked
		ps.ack(a)
		wantCommit(t, ps, 5)
		ps.addMarker(marker(1)) // an older marker fetched again moves nothing
		wantCommit(t, ps, 5)
	})

	t.Run("DropIgnoresLateAcks", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
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

func TestByteBudget(t *testing.T) {
	t.Parallel()

	t.Run("HandsOutNoMoreThanTheBudget", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(250)
		ps.add(sizedRecords(0, 9, 100))
		if got := ps.budget.readAhead; got != 1000 {
			t.Fatalf("read ahead %d bytes, want 1000", got)
		}
		recs, b := ps.take(10)
		if len(recs) != 2 || ps.budget.inFlight != 200 {
			t.Fatalf("took %d records (%d bytes in flight) under a 250-byte budget, want 2 (200)", len(recs), ps.budget.inFlight)
		}
		if more, _ := ps.take(10); more != nil {
			t.Fatalf("took %d more records with the budget full", len(more))
		}
		ps.ack(b)
		if ps.budget.inFlight != 0 || ps.budget.readAhead != 800 {
			t.Fatalf("after the ack in flight %d, read ahead %d; want 0 and 800", ps.budget.inFlight, ps.budget.readAhead)
		}
		if recs, _ := ps.take(10); len(recs) != 2 {
			t.Fatalf("took %d records after the ack, want 2", len(recs))
		}
	})

	t.Run("ALargerRecordGoesAlone", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(250)
		ps.add(sizedRecords(0, 0, 10))
		ps.add(sizedRecords(1, 2, 1000))
		small := handOut(t, ps, 1)
		if recs, _ := ps.take(10); recs != nil {
			t.Fatalf("took a record larger than the budget while %d bytes were in flight", ps.budget.inFlight)
		}
		ps.ack(small)
		big := handOut(t, ps, 1)
		if recs, _ := ps.take(10); recs != nil {
			t.Fatal("took a second record next to one larger than the budget")
		}
		if !ps.budget.full() {
			t.Fatal("the budget is not full with a record larger than it in flight")
		}
		ps.ack(big)
		handOut(t, ps, 1)
	})

	t.Run("AnAckBehindAGapGivesItsBytesBack", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.add(sizedRecords(0, 1, 100))
		first, second := handOut(t, ps, 1), handOut(t, ps, 1)
		ps.ack(second)
		wantCommit(t, ps, -1)
		if ps.budget.inFlight != 100 {
			t.Fatalf("in flight %d bytes after the second record's ack, want 100: the pipeline no longer holds it", ps.budget.inFlight)
		}
		ps.ack(first)
		wantCommit(t, ps, 2)
	})

	t.Run("DropGivesReadAheadBackAndLateAcksTheRest", func(t *testing.T) {
		t.Parallel()
		ps := newTestPartition(1 << 30)
		ps.add(sizedRecords(0, 4, 100))
		b := handOut(t, ps, 2)
		ps.drop()
		if ps.budget.readAhead != 0 || ps.budget.inFlight != 200 {
			t.Fatalf("after the drop read ahead %d, in flight %d; want 0 and 200 (still in the pipeline)", ps.budget.readAhead, ps.budget.inFlight)
		}
		ps.ack(b)
		if ps.budget.inFlight != 0 {
			t.Fatalf("in flight %d bytes after the late ack, want 0", ps.budget.inFlight)
		}
	})
}
