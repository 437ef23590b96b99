package kafka

// The kafka_franz input's batches: what the input hands out, how a batching
// policy groups it, and what the ack of a batch does.

import (
	"context"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// share is the part of a delivered batch that comes from one partition: a
// run of its consecutive records, tracked until the batch is acked.
type share struct {
	ps *partitionState
	tb *trackedBatch
}

// takeLocked hands out the pending records of every partition with room
// under checkpoint_limit and the byte budget, at most maxRecords in all,
// and returns their messages. Each partition's records are tracked
// as a share of their own, so its commit point moves only when the whole
// batch is acked. The map's random order keeps one partition from always
// coming first when the batch fills up.
func (f *franzInput) takeLocked(maxRecords int) (service.MessageBatch, []share) {
	var (
		batch  service.MessageBatch
		shares []share
	)
	n := 0
	for _, ps := range f.parts {
		room := min(maxRecords-n, f.checkpointLimit-ps.handed)
		if room <= 0 || len(ps.pending) == 0 {
			continue
		}
		recs, tb := ps.take(room)
		if tb == nil {
			continue // the byte budget is full; a smaller record elsewhere may fit
		}
		shares = append(shares, share{ps: ps, tb: tb})
		if batch == nil {
			// maxRecords may be checkpoint_limit, which may be as large
			// as an int: size the batch by what is pending instead.
			batch = make(service.MessageBatch, 0, min(maxRecords, f.pendingLocked()))
		}
		for i := range recs {
			batch = append(batch, recs[i].msg)
			recs[i] = fetched{} // the pipeline holds the message now, not us
		}
		if n += len(recs); n >= maxRecords {
			break
		}
	}
	if len(shares) > 0 {
		f.roomFreed()
	}
	return batch, shares
}

// pendingLocked counts the records fetched and not yet handed out.
func (f *franzInput) pendingLocked() int {
	n := 0
	for _, ps := range f.parts {
		n += len(ps.pending)
	}
	return n
}

// policyBatcher applies the batching policy to what the input hands out.
// It is used by the reader only (under readerMu).
type policyBatcher struct {
	b      *service.Batcher
	count  int // the policy's count, 0 if none
	n      int // messages added since the last flush
	shares []share
	closed bool
	// atOnce flushes every batch as soon as it is taken: the policy has
	// no trigger of its own (see policyTriggers).
	atOnce bool
}

// policyTriggers reports whether a batching policy flushes a batch by
// itself: by count, size, check, or a period above zero. Benthos accepts
// `period: 0s` alone, whose period never ends: the input would hold records
// until a partition reached checkpoint_limit. It flushes such batches at
// once instead: `period: 0s` means "do not wait".
func policyTriggers(p service.BatchPolicy) bool {
	period, _ := time.ParseDuration(p.Period) // NewBatcher has refused a bad one
	return p.Count > 0 || p.ByteSize > 0 || p.Check != "" || period > 0
}

// nextBatch takes what the input can hand out. Without a batching policy
// (Connect's kafka_franz configs, which need none) that is the batch, at
// most checkpoint_limit records of every partition with room. With one
// (pipelines/forwarder.yaml has a period), it joins the policy's batch,
// which is flushed when the policy triggers, its period ends, or nothing
// more can join it before it is acked. When there is no batch yet, it returns how
// long to wait for more records or room (-1: until they come).
func (f *franzInput) nextBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, time.Duration, error) {
	pb := f.batcher
	for {
		maxRecords := f.checkpointLimit
		if pb != nil && pb.count > 0 {
			maxRecords = pb.count - pb.n
		}
		f.mu.Lock()
		msgs, shares := f.takeLocked(maxRecords)
		stuck := false
		if pb != nil {
			pb.shares = append(pb.shares, shares...)
			stuck = f.stuckLocked(pb.shares)
		}
		f.mu.Unlock()
		if pb == nil {
			if len(shares) == 0 {
				return nil, nil, -1, nil
			}
			return msgs, f.ackFunc(shares), 0, nil
		}

		triggered := false
		for _, m := range msgs {
			triggered = pb.b.Add(m)
		}
		pb.n += len(msgs)
		if pb.n == 0 {
			return nil, nil, -1, nil
		}
		until, timed := pb.b.UntilNext()
		if !triggered && !stuck && !pb.atOnce && (!timed || until > time.Millisecond) {
			if !timed {
				until = -1
			}
			return nil, nil, until, nil
		}
		batch, ack, err := f.flushPolicyBatch(ctx)
		if err != nil || batch != nil {
			return batch, ack, 0, err
		}
		// The batching processors filtered the whole batch out: build the
		// next one.
	}
}

// stuckLocked reports whether records waiting in the batching policy keep
// more from being handed out until they are acked: a partition of theirs
// is at checkpoint_limit, or the byte budget is full.
func (f *franzInput) stuckLocked(waiting []share) bool {
	if f.budget.full() {
		return true
	}
	for _, s := range waiting {
		if !s.ps.dead && s.ps.handed >= f.checkpointLimit {
			return true
		}
	}
	return false
}

// flushPolicyBatch flushes the policy's batch. A batch its processors
// filtered out entirely counts as delivered and is acked at once; then it
// returns no batch.
func (f *franzInput) flushPolicyBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	pb := f.batcher
	batch, err := pb.b.Flush(ctx)
	ack := f.ackFunc(pb.shares)
	pb.shares, pb.n = nil, 0
	if err != nil {
		return nil, nil, err
	}
	if len(batch) == 0 {
		if ctx.Err() != nil {
			// The batching processors were interrupted: leave the
			// records unacked so they are read again.
			return nil, nil, ctx.Err()
		}
		_ = ack(ctx, nil)
		return nil, nil, nil
	}
	return batch, ack, nil
}

// ackFunc returns the acknowledgement of a delivered batch: each share is
// marked acked and its partition's commit point moves over the acked
// prefix. A share whose partition was revoked meanwhile only gives its
// bytes back: whoever owns the partition now reads it again from the last
// commit.
func (f *franzInput) ackFunc(shares []share) service.AckFunc {
	var n int64
	for _, s := range shares {
		n += int64(s.tb.n)
	}
	f.unacked.Add(n)
	var once sync.Once
	return func(_ context.Context, err error) error {
		once.Do(func() { f.unacked.Add(-n) })
		if err != nil {
			// service.AutoRetryNacksBatched delivers a rejected batch
			// again until it is acked, and calls us only then. An error
			// here means the stream gave up on the batch as it stops:
			// its records stay unacked, so they are read again.
			return nil
		}
		f.mu.Lock()
		for _, s := range shares {
			s.ps.ack(s.tb)
		}
		f.mu.Unlock()
		f.signal()    // the reader may hand out more
		f.roomFreed() // and the poll loop fetch more
		return nil
	}
}
