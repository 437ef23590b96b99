package kafka

import (
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
)

// topicPartition names one partition of one topic.
type topicPartition struct {
	topic     string
	partition int32
}

// fetched is a record read from Kafka with its message, which the poll loop
// builds as it reads so that building messages runs alongside the reader
// rather than in its way (it is most of an input's work per record).
type fetched struct {
	rec  *kgo.Record
	msg  *service.Message
	size int64 // recordSize(rec)
}

// recordSize is what a record costs the byte budget: its value, key and
// headers, the bytes the pipeline holds for it.
func recordSize(r *kgo.Record) int64 {
	n := len(r.Value) + len(r.Key)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// byteBudget counts the record bytes the input holds, over all partitions
// (max_buffered_bytes). It is guarded by the input's lock.
type byteBudget struct {
	limit     int64
	readAhead int64 // fetched, not yet handed out
	inFlight  int64 // handed out, not yet acked
}

// full reports whether fetching must wait: the input holds the whole budget.
func (b *byteBudget) full() bool { return b.readAhead+b.inFlight >= b.limit }

// fits reports whether a record of size bytes may be handed out now. A
// record larger than the whole budget goes when nothing else is in flight,
// alone, so that it is delivered at all.
func (b *byteBudget) fits(size int64) bool { return b.inFlight == 0 || b.inFlight+size <= b.limit }

// trackedBatch is a run of consecutive records of one partition that was
// handed to the pipeline together and is waiting for its ack.
type trackedBatch struct {
	first, last int64 // offsets of its first and last record
	epoch       int32 // leader epoch of its last record, committed with the offset
	n           int   // number of records
	bytes       int64 // their size, counted in budget until the ack
	budget      *byteBudget

	acked bool
}

// partitionState is the at-least-once bookkeeping of one partition while it
// is assigned to us. Every method must be called with the input's lock held.
//
// Records move through three stages:
//
//	pending  — fetched (and their messages built), not yet handed out;
//	handed   — in the pipeline (inflight holds their batches, in offset
//	           order);
//	released — acked, and so are all records before them: the commit point
//	           moves past them and they stop counting against
//	           checkpoint_limit.
//
// Acks arrive in any order; the commit point only moves over the acked
// prefix of inflight, so it never passes a record that is not acked. The
// bytes of a batch leave the budget at its ack, whatever its place: the
// pipeline holds them no longer.
type partitionState struct {
	tp     topicPartition
	budget *byteBudget

	pending      []fetched
	pendingBytes int64
	handed       int
	inflight     []*trackedBatch

	next      kgo.EpochOffset // commit point: first offset not known to be acked; Offset < 0 until one is
	committed int64           // last offset committed to the group, -1 if none by us
	nextFetch int64           // offset after the last record or marker fetched, -1 before the first
	// marker: past the transaction marker that ended the fetched records
	// (Offset -1 if none), where the commit point goes once nothing
	// before it is held.
	marker kgo.EpochOffset

	dead bool // revoked or lost: nothing may be committed or handed out for it any more
	// stale: the topic was deleted and created again, and this is the old
	// topic's partition: its offsets would land on the new topic's.
	stale bool
}

func newPartitionState(tp topicPartition, budget *byteBudget) *partitionState {
	return &partitionState{
		tp:        tp,
		budget:    budget,
		next:      kgo.EpochOffset{Epoch: -1, Offset: -1},
		committed: -1,
		nextFetch: -1,
		marker:    kgo.EpochOffset{Epoch: -1, Offset: -1},
	}
}

// tracked is the number of records held for the partition, fetched but not
// yet released.
func (p *partitionState) tracked() int { return len(p.pending) + p.handed }

// add appends freshly fetched records of the partition, which franz-go
// returns in offset order. Records before the next offset expected would be
// duplicates of records already held, and the commit point relies on
// offsets only growing, so they are skipped. add keeps recs, which the
// caller must not reuse, and returns how many it added.
func (p *partitionState) add(recs []fetched) int {
	if p.dead {
		return 0
	}
	for len(recs) > 0 && recs[0].rec.Offset < p.nextFetch {
		recs = recs[1:]
	}
	if len(recs) == 0 {
		return 0
	}
	if p.pending == nil {
		p.pending = recs
	} else {
		p.pending = append(p.pending, recs...)
	}
	for _, fr := range recs {
		p.pendingBytes += fr.size
		p.budget.readAhead += fr.size
	}
	p.nextFetch = recs[len(recs)-1].rec.Offset + 1
	return len(recs)
}

// take hands out up to maxRecords pending records, in offset order, as much
// as the byte budget lets through, and tracks them as one batch in flight.
// It returns nil when nothing can be handed out.
func (p *partitionState) take(maxRecords int) ([]fetched, *trackedBatch) {
	k := 0
	var bytes int64
	for k < min(maxRecords, len(p.pending)) && p.budget.fits(p.pending[k].size) {
		bytes += p.pending[k].size
		p.budget.readAhead -= p.pending[k].size
		p.budget.inFlight += p.pending[k].size
		k++
	}
	if k == 0 {
		return nil, nil
	}
	out := p.pending[:k:k]
	p.pending = p.pending[k:]
	if len(p.pending) == 0 {
		p.pending = nil
	}
	p.pendingBytes -= bytes
	p.handed += k
	first, last := out[0].rec, out[k-1].rec
	b := &trackedBatch{first: first.Offset, last: last.Offset, epoch: last.LeaderEpoch, n: k, bytes: bytes, budget: p.budget}
	p.inflight = append(p.inflight, b)
	return out, b
}

// ack marks b acknowledged and releases the acked prefix of the in-flight
// batches. It reports whether the commit point moved.
func (p *partitionState) ack(b *trackedBatch) bool {
	if b.acked {
		return false
	}
	b.acked = true
	b.budget.inFlight -= b.bytes
	if p.dead {
		return false
	}
	moved := false
	for len(p.inflight) > 0 && p.inflight[0].acked {
		head := p.inflight[0]
		p.inflight[0] = nil
		p.inflight = p.inflight[1:]
		p.handed -= head.n
		p.next = kgo.EpochOffset{Epoch: head.epoch, Offset: head.last + 1}
		moved = true
	}
	if len(p.inflight) == 0 {
		p.inflight = nil
		moved = p.passMarker() || moved
	}
	return moved
}

// addMarker notes the transaction marker fetched after the records added
// last (see withoutMarkers): the commit point passes it once none of them
// is held, at once if none is.
func (p *partitionState) addMarker(marker kgo.EpochOffset) {
	if p.dead || marker.Offset <= p.nextFetch {
		return
	}
	p.nextFetch = marker.Offset
	p.marker = marker
	p.passMarker()
}

// passMarker moves the commit point past the transaction marker that ended
// the records fetched once none of them is held, and reports whether it
// moved. The marker is an offset no message stands for: without this a
// partition whose last write ended a transaction would stay committed one
// offset short of its end, and an aborted transaction alone would never be
// committed past.
func (p *partitionState) passMarker() bool {
	if p.marker.Offset <= p.next.Offset || len(p.pending) > 0 || len(p.inflight) > 0 {
		return false
	}
	p.next = p.marker
	return true
}

// committable returns the commit point when it is ahead of the last commit.
func (p *partitionState) committable() (kgo.EpochOffset, bool) {
	if p.dead || p.stale || p.next.Offset < 0 || p.next.Offset <= p.committed {
		return kgo.EpochOffset{}, false
	}
	return p.next, true
}

// drop marks the partition as no longer ours: nothing more is committed or
// handed out for it, and late acks only give their bytes back to the budget
// (the pipeline held them until then).
func (p *partitionState) drop() {
	p.dead = true
	p.budget.readAhead -= p.pendingBytes
	p.pending, p.pendingBytes = nil, 0
	p.inflight = nil
	p.handed = 0
}
