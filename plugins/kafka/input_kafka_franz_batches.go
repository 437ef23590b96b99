package kafka

// The kafka_franz input's batches: how records become batches (per fetch or
// under a batching policy), and what an ack or a nack of a batch does.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// partBatcher builds the next batch of one partition under a batching
// policy.
type partBatcher struct {
	ps    *partitionState
	gen   uint64
	b     *service.Batcher
	queue []fetched // handed out, not yet added to b

	first, last int64
	epoch       int32
	n           int // records added to b
}

// nextFetchBatch, without a batching policy, hands out in one batch the
// pending records of every partition with room under checkpoint_limit, at
// most maxFetchBatch records in all. Each partition's share is tracked as a
// batch of its own, so its commit point moves only when the whole batch is
// acked. The map's random order keeps one partition from always coming
// first when the batch fills up.
func (f *franzInput) nextFetchBatch() (service.MessageBatch, service.AckFunc) {
	f.mu.Lock()
	var (
		shares []share
		n      int
	)
	for _, ps := range f.parts {
		room := min(f.maxFetchBatch-n, f.checkpointLimit-ps.handed)
		if len(ps.pending) == 0 || room <= 0 {
			continue
		}
		recs := ps.take(room)
		first, last := recs[0].rec, recs[len(recs)-1].rec
		shares = append(shares, share{
			ps:   ps,
			tb:   ps.track(first.Offset, last.Offset, last.LeaderEpoch, len(recs)),
			recs: recs,
		})
		if n += len(recs); n >= f.maxFetchBatch {
			break
		}
	}
	if len(shares) > 0 {
		f.roomFreed()
	}
	f.mu.Unlock()
	if len(shares) == 0 {
		return nil, nil
	}
	batch := make(service.MessageBatch, 0, n)
	for _, s := range shares {
		for _, fr := range s.recs {
			batch = append(batch, fr.msg)
		}
	}
	return batch, f.ackFunc(&replay{shares: shares})
}

// share is the part of a delivered batch that comes from one partition.
type share struct {
	ps   *partitionState
	tb   *trackedBatch
	recs []fetched // nil for a batch flushed by a batching policy
}

// live reports whether the share still counts: its partition is still
// ours, it was not rewound away, and it is not acked yet.
func (s share) live() bool { return !s.ps.dead && !s.tb.dropped && !s.tb.acked }

// replay is a delivered batch as the input can deliver it again after a
// nack: from its records (messages rebuilt as they were read, since the
// pipeline may have changed the ones it was given) or, when a batching
// policy made it, from an untouched copy of the flushed messages.
type replay struct {
	shares []share              // one per partition, in the order of the batch
	msgs   service.MessageBatch // a policy's batch, of one partition

	attempt int
	due     time.Time
}

func (r *replay) batch() service.MessageBatch {
	if r.msgs != nil {
		return r.msgs.Copy()
	}
	n := 0
	for _, s := range r.shares {
		n += len(s.recs)
	}
	batch := make(service.MessageBatch, 0, n)
	for _, s := range r.shares {
		var topic, partition any = s.ps.tp.topic, int64(s.ps.tp.partition)
		for _, fr := range s.recs {
			batch = append(batch, recordToMessage(fr.rec, topic, partition))
		}
	}
	return batch
}

// prune drops the shares that no longer count (their partition was
// revoked, say) and reports whether any is left to deliver again.
func (r *replay) prune() bool {
	r.shares = slices.DeleteFunc(r.shares, func(s share) bool { return !s.live() })
	return len(r.shares) > 0
}

// nextReplay returns a nacked batch whose backoff has passed, or how long
// until the next one is due (-1: none waiting).
func (f *franzInput) nextReplay(now time.Time) (service.MessageBatch, service.AckFunc, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := time.Duration(-1)
	for i := 0; i < len(f.replays); i++ {
		r := f.replays[i]
		if !r.prune() {
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
			fr := pb.queue[0]
			pb.queue[0] = fetched{}
			pb.queue = pb.queue[1:]
			if pb.n == 0 {
				pb.first = fr.rec.Offset
			}
			pb.last, pb.epoch = fr.rec.Offset, fr.rec.LeaderEpoch
			pb.n++
			full = pb.b.Add(fr.msg)
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
		r := &replay{shares: []share{{ps: ps, tb: tb}}, msgs: msgs}
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

// ackFunc returns the acknowledgement of a delivered batch, applied to
// each partition's share of it. An ack releases every share (see
// partitionState.ack); a nack either queues the batch to be delivered again
// after a backoff (auto_replay_nacks) or rewinds each partition to its
// share. Nothing is skipped. A share whose partition was revoked meanwhile
// is left alone: whoever owns the partition now reads it again from the
// last commit.
func (f *franzInput) ackFunc(r *replay) service.AckFunc {
	return func(_ context.Context, err error) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err == nil {
			moved := false
			for _, s := range r.shares {
				moved = s.ps.ack(s.tb) || moved
			}
			if moved {
				f.signal() // room in the pipeline for more of these partitions
			}
			return nil
		}
		if !r.prune() {
			return nil
		}
		if f.replayNacks {
			r.attempt++
			r.due = time.Now().Add(replayBackoff(r.attempt))
			f.replays = append(f.replays, r)
			f.log.Debugf("kafka_franz: batch %s was rejected, delivering it again in %s: %v",
				r, replayBackoff(r.attempt), err)
			f.signal()
			return nil
		}
		rewound := false
		for _, s := range r.shares {
			if s.ps.rewind(s.tb) {
				rewound = true
				f.log.Warnf("kafka_franz: batch %s was rejected, reading the partition again from offset %d: %v",
					s, s.tb.first, err)
			}
		}
		if rewound {
			f.seekWanted = true
			if f.wakePoll != nil {
				f.wakePoll()
			}
			f.roomFreed()
		}
		return nil
	}
}

// String names the share's records, for logs: topic/partition offsets.
func (s share) String() string {
	return fmt.Sprintf("%s/%d offsets %d-%d", s.ps.tp.topic, s.ps.tp.partition, s.tb.first, s.tb.last)
}

// String names the batch's records, for logs.
func (r *replay) String() string {
	names := make([]string, len(r.shares))
	for i, s := range r.shares {
		names[i] = s.String()
	}
	return strings.Join(names, ", ")
}
