package kafka

// The kafka_franz input's batches: how records become batches (per fetch or
// under a batching policy), and what an ack or a nack of a batch does.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
)

// partBatcher builds the next batch of one partition under a batching
// policy.
type partBatcher struct {
	ps    *partitionState
	gen   uint64
	b     *service.Batcher
	queue []*kgo.Record // handed out, not yet added to b

	first, last int64
	epoch       int32
	n           int // records added to b
}

// nextFetchBatch, without a batching policy, hands out the pending records
// of one partition (up to its room under checkpoint_limit) as a batch.
func (f *franzInput) nextFetchBatch() (service.MessageBatch, service.AckFunc) {
	f.mu.Lock()
	var (
		ps   *partitionState
		recs []*kgo.Record
		tb   *trackedBatch
	)
	for _, st := range f.parts {
		if len(st.pending) == 0 || st.handed >= f.checkpointLimit {
			continue
		}
		ps = st
		recs = st.take(min(f.maxFetchBatch, f.checkpointLimit-st.handed))
		f.roomFreed()
		last := recs[len(recs)-1]
		tb = st.track(recs[0].Offset, last.Offset, last.LeaderEpoch, len(recs))
		break
	}
	f.mu.Unlock()
	if ps == nil {
		return nil, nil
	}
	return recordsToBatch(recs), f.ackFunc(&replay{ps: ps, tb: tb, recs: recs})
}

// replay is a delivered batch as the input can deliver it again after a
// nack: from its records (rebuilt as they were read) or, when batching
// processors made it, from an untouched copy of the flushed messages.
type replay struct {
	ps   *partitionState
	tb   *trackedBatch
	recs []*kgo.Record
	msgs service.MessageBatch

	attempt int
	due     time.Time
}

func (r *replay) batch() service.MessageBatch {
	if r.msgs != nil {
		return r.msgs.Copy()
	}
	return recordsToBatch(r.recs)
}

// nextReplay returns a nacked batch whose backoff has passed, or how long
// until the next one is due (-1: none waiting).
func (f *franzInput) nextReplay(now time.Time) (service.MessageBatch, service.AckFunc, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := time.Duration(-1)
	for i := 0; i < len(f.replays); i++ {
		r := f.replays[i]
		if r.ps.dead || r.tb.dropped || r.tb.acked {
			f.replays = slices.Delete(f.replays, i, i+1)
			i--
			continue
		}
		if d := r.due.Sub(now); d > 0 {
			if wait < 0 || d < wait {
				wait = d
			}
			continue
		}
		f.replays = slices.Delete(f.replays, i, i+1)
		return r.batch(), f.ackFunc(r), -1
	}
	return nil, nil, wait
}

// replayBackoff is the wait before the n-th delivery of a nacked batch.
func replayBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<min(attempt-1, 16), 10*time.Second)
}

// nextPolicyBatch, with a batching policy, feeds each partition's batcher
// and flushes the first one that is due. It also returns how long until a
// period flush is due (-1: none), for ReadBatch to wait.
func (f *franzInput) nextPolicyBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, time.Duration, error) {
	type feed struct {
		pb      *partBatcher
		atLimit bool
	}
	var (
		feeds []feed
		stale []*partBatcher
	)
	f.mu.Lock()
	for tp, pb := range f.batchers {
		if ps := f.parts[tp]; ps == nil || ps != pb.ps || ps.gen != pb.gen {
			stale = append(stale, pb)
			delete(f.batchers, tp)
		}
	}
	for tp, ps := range f.parts {
		pb := f.batchers[tp]
		if pb == nil {
			if len(ps.pending) == 0 {
				continue
			}
			pb = &partBatcher{ps: ps, gen: ps.gen}
			f.batchers[tp] = pb
		}
		if room := f.checkpointLimit - ps.handed; room > 0 && len(ps.pending) > 0 {
			pb.queue = append(pb.queue, ps.take(room)...)
			f.roomFreed()
		}
		feeds = append(feeds, feed{pb: pb, atLimit: ps.handed >= f.checkpointLimit})
	}
	f.mu.Unlock()

	for _, pb := range stale {
		if pb.b != nil {
			_ = pb.b.Close(ctx)
		}
	}

	wait := time.Duration(-1)
	for _, fd := range feeds {
		pb := fd.pb
		if pb.b == nil {
			b, err := f.batchPolicy.NewBatcher(f.res)
			if err != nil {
				return nil, nil, -1, fmt.Errorf("creating batcher: %w", err)
			}
			pb.b = b
		}
		full := false
		for len(pb.queue) > 0 && !full {
			r := pb.queue[0]
			pb.queue[0] = nil
			pb.queue = pb.queue[1:]
			if pb.n == 0 {
				pb.first = r.Offset
			}
			pb.last, pb.epoch = r.Offset, r.LeaderEpoch
			pb.n++
			full = pb.b.Add(recordToMessage(r, r.Topic, int64(r.Partition)))
		}
		if pb.n == 0 {
			continue
		}
		until, timed := pb.b.UntilNext()
		due := timed && until <= time.Millisecond
		if !full && !due && !(fd.atLimit && len(pb.queue) == 0) {
			if timed && (wait < 0 || until < wait) {
				wait = until
			}
			continue
		}

		msgs, err := pb.b.Flush(ctx)
		if err != nil {
			return nil, nil, -1, fmt.Errorf("flushing batch: %w", err)
		}
		first, last, epoch, n := pb.first, pb.last, pb.epoch, pb.n
		pb.n = 0

		f.mu.Lock()
		ps := pb.ps
		if ps.dead || ps.gen != pb.gen {
			// Revoked or rewound while we built it: its records are
			// read again by whoever owns the partition now.
			f.mu.Unlock()
			continue
		}
		tb := ps.track(first, last, epoch, n)
		f.mu.Unlock()
		r := &replay{ps: ps, tb: tb, msgs: msgs}
		ack := f.ackFunc(r)
		if len(msgs) == 0 {
			if ctx.Err() != nil {
				// The batching processors were interrupted: leave
				// the records unacked so they are read again.
				return nil, nil, -1, ctx.Err()
			}
			// The batching processors filtered every message out,
			// which counts as delivered.
			_ = ack(ctx, nil)
			continue
		}
		if f.replayNacks {
			// Downstream processors may change the messages we hand
			// out; a replay needs them as they were.
			return msgs.Copy(), ack, -1, nil
		}
		r.msgs = nil
		return msgs, ack, -1, nil
	}
	return nil, nil, wait, nil
}

// ackFunc returns the acknowledgement of a delivered batch. An ack
// releases the batch (see partitionState.ack); a nack either queues it to be
// delivered again after a backoff (auto_replay_nacks) or rewinds the
// partition to it. It is never skipped.
func (f *franzInput) ackFunc(r *replay) service.AckFunc {
	return func(_ context.Context, err error) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		ps, tb := r.ps, r.tb
		if ps.dead || tb.dropped || tb.acked {
			return nil
		}
		if err == nil {
			if ps.ack(tb) {
				f.signal() // room in the pipeline for more of this partition
			}
			return nil
		}
		if f.replayNacks {
			r.attempt++
			r.due = time.Now().Add(replayBackoff(r.attempt))
			f.replays = append(f.replays, r)
			f.log.Debugf("kafka_franz: batch %s/%d offsets %d-%d was rejected, delivering it again in %s: %v",
				ps.tp.topic, ps.tp.partition, tb.first, tb.last, replayBackoff(r.attempt), err)
			f.signal()
			return nil
		}
		if ps.rewind(tb) {
			f.log.Warnf("kafka_franz: batch %s/%d offsets %d-%d was rejected, reading the partition again from offset %d: %v",
				ps.tp.topic, ps.tp.partition, tb.first, tb.last, tb.first, err)
			f.seekWanted = true
			if f.wakePoll != nil {
				f.wakePoll()
			}
			f.roomFreed()
		}
		return nil
	}
}
