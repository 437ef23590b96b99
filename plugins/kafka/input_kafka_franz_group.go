package kafka

// The kafka_franz input's side of the consumer group: the poll loop with
// its back-pressure, commits, and the rebalance callbacks.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// pollLoop fetches records into the partitions' pending queues until ctx
// ends. It is the only goroutine that polls and seeks.
func (f *franzInput) pollLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	// Fetch errors are logged once each until records flow again.
	loggedErrs := make(map[string]bool)
	for {
		if !f.waitForRoom(ctx) {
			cl.AllowRebalance()
			return
		}
		pctx, wake := context.WithCancel(ctx)
		f.mu.Lock()
		f.wakePoll = wake
		if f.seekWanted {
			wake()
		}
		f.mu.Unlock()

		fetches := cl.PollRecords(pctx, f.checkpointLimit)
		wake()
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return
		}

		// Messages are built before taking the lock, so the reader
		// can hand out batches meanwhile.
		type polledPartition struct {
			tp   topicPartition
			recs []fetched
		}
		var polled []polledPartition
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) > 0 {
				polled = append(polled, polledPartition{topicPartition{fp.Topic, fp.Partition}, buildMessages(fp.Records)})
			}
		})

		got := 0
		var seeks map[string]map[int32]kgo.EpochOffset
		f.mu.Lock()
		for _, pr := range polled {
			ps := f.parts[pr.tp]
			if ps == nil {
				ps = newPartitionState(pr.tp)
				f.parts[pr.tp] = ps
			}
			got += ps.add(pr.recs)
		}
		if f.seekWanted {
			f.seekWanted = false
			seeks = make(map[string]map[int32]kgo.EpochOffset)
			for tp, ps := range f.parts {
				if ps.seekTo < 0 {
					continue
				}
				if seeks[tp.topic] == nil {
					seeks[tp.topic] = make(map[int32]kgo.EpochOffset)
				}
				seeks[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: ps.seekTo}
				ps.seekTo = -1
			}
		}
		f.mu.Unlock()

		// franz-go asks for seeks before AllowRebalance, so no revoke
		// runs in between.
		if len(seeks) > 0 {
			cl.SetOffsets(seeks)
		}
		cl.AllowRebalance()
		if got > 0 {
			f.signal()
			clear(loggedErrs)
		}

		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) {
				return
			}
			msg := fmt.Sprintf("fetching %s/%d: %v", topic, partition, err)
			if loggedErrs[msg] {
				f.log.Debugf("kafka_franz: %s", msg)
				return
			}
			loggedErrs[msg] = true
			f.log.Warnf("kafka_franz: %s (retrying, logged once until records flow again)", msg)
		})
	}
}

// waitForRoom is the back-pressure: it blocks while some partition already
// has checkpoint_limit records fetched and waiting for the pipeline. Not
// polling leaves the next records in franz-go's buffer (one fetch per
// broker), which stops fetching altogether until we poll again. It reports
// false when ctx ends.
func (f *franzInput) waitForRoom(ctx context.Context) bool {
	for {
		f.mu.Lock()
		full := false
		if !f.seekWanted {
			for _, ps := range f.parts {
				if len(ps.pending) >= f.checkpointLimit {
					full = true
					break
				}
			}
		}
		f.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-f.room:
		case <-ctx.Done():
			return false
		}
	}
}

// roomFreed wakes the poll loop.
func (f *franzInput) roomFreed() {
	select {
	case f.room <- struct{}{}:
	default:
	}
}

// signal wakes the reader.
func (f *franzInput) signal() {
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

func (f *franzInput) commitLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	t := time.NewTicker(f.commitPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, max(f.commitPeriod, 10*time.Second))
			f.commitAll(cctx, cl, "periodic")
			cancel()
		}
	}
}

// commitAll commits the commit point of every partition that moved.
func (f *franzInput) commitAll(ctx context.Context, cl *kgo.Client, why string) {
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	f.mu.Lock()
	offsets := f.committableLocked(nil)
	f.mu.Unlock()
	f.commitLocked(ctx, cl, offsets, why)
}

// committableLocked returns the commit points that moved, of the given
// partitions or (nil) of all.
func (f *franzInput) committableLocked(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	out := make(map[string]map[int32]kgo.EpochOffset)
	add := func(tp topicPartition, ps *partitionState) {
		eo, ok := ps.committable()
		if !ok {
			return
		}
		if out[tp.topic] == nil {
			out[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		out[tp.topic][tp.partition] = eo
	}
	if only == nil {
		for tp, ps := range f.parts {
			add(tp, ps)
		}
		return out
	}
	for topic, ps := range only {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := f.parts[tp]; st != nil {
				add(tp, st)
			}
		}
	}
	return out
}

// commitLocked commits offsets synchronously; commitMu must be held.
func (f *franzInput) commitLocked(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]kgo.EpochOffset, why string) {
	if len(offsets) == 0 {
		return
	}
	var failed []string
	var reqErr error
	done := make(map[topicPartition]int64)
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					failed = append(failed, fmt.Sprintf("%s/%d: %v", t.Topic, p.Partition, perr))
					continue
				}
				if eo, ok := offsets[t.Topic][p.Partition]; ok {
					done[topicPartition{t.Topic, p.Partition}] = eo.Offset
				}
			}
		}
	})
	switch {
	case reqErr != nil && (errors.Is(reqErr, context.Canceled) || errors.Is(reqErr, kgo.ErrClientClosed)):
		f.log.Debugf("kafka_franz: %s commit abandoned: %v", why, reqErr)
	case reqErr != nil:
		f.log.Warnf("kafka_franz: %s commit of group %q failed, will retry: %v", why, f.group, reqErr)
	case len(failed) > 0:
		f.log.Warnf("kafka_franz: %s commit of group %q failed for %s, will retry", why, f.group, strings.Join(failed, ", "))
	}
	if len(done) == 0 {
		return
	}
	f.mu.Lock()
	for tp, off := range done {
		if ps := f.parts[tp]; ps != nil && off > ps.committed {
			ps.committed = off
		}
	}
	f.mu.Unlock()
	f.log.Tracef("kafka_franz: %s commit of %v", why, done)
}

func (f *franzInput) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if len(assigned) > 0 {
		f.log.Infof("kafka_franz: assigned partitions %s", formatPartitions(assigned))
	}
}

// onRevoked commits what is safe to commit for the revoked partitions and
// forgets them. Records of theirs still in the pipeline are not waited for:
// their acks are ignored and the next owner reads them again from the
// commit point (at-least-once).
func (f *franzInput) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	// Take the commit points and forget the partitions at once: an ack
	// arriving after this is not committed by us, whoever gets the
	// partition reads its records again.
	f.mu.Lock()
	offsets := f.committableLocked(revoked)
	f.dropLocked(revoked)
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, f.closeTimeout)
	f.commitLocked(cctx, cl, offsets, "revoke")
	cancel()
	f.log.Infof("kafka_franz: revoked partitions %s", formatPartitions(revoked))
}

// onLost forgets partitions that were taken away without a clean revoke: a
// commit would be rejected, and nothing past the last commit is lost since
// the next owner starts there.
func (f *franzInput) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 {
		return
	}
	f.mu.Lock()
	f.dropLocked(lost)
	f.mu.Unlock()
	f.log.Warnf("kafka_franz: lost partitions %s; records after their last commit will be consumed again", formatPartitions(lost))
}

func (f *franzInput) dropLocked(parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := f.parts[tp]; st != nil {
				st.drop()
				delete(f.parts, tp)
			}
		}
	}
	f.roomFreed()
}

func formatPartitions(m map[string][]int32) string {
	var parts []string
	for _, topic := range slices.Sorted(maps.Keys(m)) {
		ps := slices.Clone(m[topic])
		slices.Sort(ps)
		parts = append(parts, fmt.Sprintf("%s%v", topic, ps))
	}
	return strings.Join(parts, " ")
}
