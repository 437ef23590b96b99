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
	rec *kgo.Record
	msg *service.Message
}

// trackedBatch is a run of consecutive records of one partition that was
// handed to the pipeline as one batch and is waiting for its ack.
type trackedBatch struct {
	first, last int64 // offsets of its first and last record
	epoch       int32 // leader epoch of its last record, committed with the offset
	n           int   // number of records

	acked   bool
	dropped bool // no longer tracked (rewound or partition revoked): its ack is ignored
}

// partitionState is the at-least-once bookkeeping of one partition while it
// is assigned to us. Every method must be called with the input's lock held.
//
// Records move through three stages:
//
//	pending  — fetched (and their messages built), not yet given to a batch;
//	handed   — in a batch being built or in flight (inflight holds the
//	           in-flight batches, in offset order);
//	released — acked, and so are all records before them: the commit point
//	           moves past them and they stop counting against the limit.
//
// Acks arrive in any order; the commit point only moves over the acked
// prefix of inflight, so it never passes a record that is not acked.
type partitionState struct {
	tp topicPartition

	// gen changes when the partition is rewound: a batch being built from
	// records handed out under an older gen is void.
	gen uint64

	pending  []fetched
	handed   int
	inflight []*trackedBatch

	next      kgo.EpochOffset // commit point: first offset not known to be acked; Offset < 0 until one is
	committed int64           // last offset committed to the group, -1 if none by us

	seekTo    int64 // >= 0: fetching must restart at this offset (set by a nack)
	nextFetch int64 // fetched records below this offset are stale duplicates and are dropped

	dead bool // revoked or lost: nothing may be committed or handed out for it any more
}

func newPartitionState(tp topicPartition) *partitionState {
	return &partitionState{
		tp:        tp,
		next:      kgo.EpochOffset{Epoch: -1, Offset: -1},
		committed: -1,
		seekTo:    -1,
		nextFetch: -1,
	}
}

// tracked is the number of records held for the partition, fetched but not
// yet released. handed is bounded by checkpoint_limit, pending by the same
// limit plus one poll, so memory stays bounded.
func (p *partitionState) tracked() int { return len(p.pending) + p.handed }

// add appends freshly fetched records of the partition, which franz-go
// returns in offset order. Records before the next offset expected are
// stale duplicates of records already held and are skipped. While a rewind
// is waiting for its seek, fetched records are from before the seek and are
// dropped: they will be fetched again. add keeps recs, which the caller must
// not reuse, and returns how many it added.
func (p *partitionState) add(recs []fetched) int {
	if p.seekTo >= 0 || p.dead {
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
	p.nextFetch = recs[len(recs)-1].rec.Offset + 1
	return len(recs)
}

// take hands out up to max pending records, in offset order.
func (p *partitionState) take(maxRecords int) []fetched {
	k := min(maxRecords, len(p.pending))
	if k <= 0 {
		return nil
	}
	out := p.pending[:k:k]
	p.pending = p.pending[k:]
	if len(p.pending) == 0 {
		p.pending = nil
	}
	p.handed += k
	return out
}

// track registers n handed records, offsets first..last, as a batch in
// flight.
func (p *partitionState) track(first, last int64, epoch int32, n int) *trackedBatch {
	b := &trackedBatch{first: first, last: last, epoch: epoch, n: n}
	p.inflight = append(p.inflight, b)
	return b
}

// ack marks b acknowledged and releases the acked prefix of the in-flight
// batches. It reports whether the commit point moved.
func (p *partitionState) ack(b *trackedBatch) bool {
	if b.acked || b.dropped || p.dead {
		return false
	}
	b.acked = true
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
	}
	return moved
}

// rewind handles a nack of b when nacks are not replayed in memory: b and
// everything fetched after it is forgotten and fetching restarts at b's
// first offset, so the records are read from Kafka again. Batches before b
// stay in flight; the commit point cannot pass b, which is not acked.
func (p *partitionState) rewind(b *trackedBatch) bool {
	if b.acked || b.dropped || p.dead {
		return false
	}
	kept := p.inflight[:0]
	handed := 0
	for _, ib := range p.inflight {
		if ib.first >= b.first {
			ib.dropped = true
			continue
		}
		kept = append(kept, ib)
		handed += ib.n
	}
	clear(p.inflight[len(kept):])
	p.inflight = kept
	p.handed = handed // records in a batch being built are void too (gen)
	p.pending = nil
	p.gen++
	if p.seekTo < 0 || b.first < p.seekTo {
		p.seekTo = b.first
	}
	p.nextFetch = b.first
	return true
}

// committable returns the commit point when it is ahead of the last commit.
func (p *partitionState) committable() (kgo.EpochOffset, bool) {
	if p.dead || p.next.Offset < 0 || p.next.Offset <= p.committed {
		return kgo.EpochOffset{}, false
	}
	return p.next, true
}

// drop marks the partition as no longer ours: late acks are ignored and
// nothing more is committed for it.
func (p *partitionState) drop() {
	p.dead = true
	for _, b := range p.inflight {
		b.dropped = true
	}
	p.inflight = nil
	p.pending = nil
	p.handed = 0
}
