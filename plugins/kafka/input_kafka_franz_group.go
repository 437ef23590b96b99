package kafka

// The kafka_franz input's side of the consumer group: the poll loop with
// its back-pressure, commits, rebalance callbacks and the lag gauge.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/periodic"
)

// pollLoop fetches records into the partitions' pending queues until ctx
// ends. It is the only goroutine that polls.
func (f *franzInput) pollLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	// Fetch errors are logged once each until records flow again.
	loggedErrs := make(map[string]bool)
	for {
		if !f.waitForRoom(ctx) {
			cl.AllowRebalance()
			return
		}
		fetches := cl.PollRecords(ctx, f.checkpointLimit)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return
		}

		// Messages are built before taking the lock, so the reader
		// can hand out batches meanwhile.
		type polledPartition struct {
			tp     topicPartition
			recs   []fetched
			marker kgo.EpochOffset // past a transaction marker fetched after recs; Offset -1 if none
			hwm    int64
		}
		var (
			polled []polledPartition
			skips  map[string]map[int32]kgo.EpochOffset
		)
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			var recs []fetched
			if len(fp.Records) > 0 {
				f.expired.resumed(fp.Topic, fp.Partition, fp.Records[0].Offset)
			}
			data, marker := withoutMarkers(fp.Records)
			if len(data) > 0 {
				recs = buildMessages(data, f.maxMessageBytes)
			}
			if tooLarge, ok := errors.AsType[*kgo.ErrDecompressTooLarge](fp.Err); ok {
				refused := f.refusedBatch(tooLarge)
				recs = append(recs, refused)
				if skips == nil {
					skips = make(map[string]map[int32]kgo.EpochOffset)
				}
				if skips[fp.Topic] == nil {
					skips[fp.Topic] = make(map[int32]kgo.EpochOffset)
				}
				skips[fp.Topic][fp.Partition] = kgo.EpochOffset{Epoch: tooLarge.Epoch, Offset: tooLarge.NextOffset}
				why, _ := msgmeta.Oversize(refused.msg)
				f.log.Warnf("kafka_franz: %s/%d: %s; it is delivered as one empty message marked %s, and the partition goes on from offset %d",
					fp.Topic, fp.Partition, why, msgmeta.KafkaOversize, tooLarge.NextOffset)
			}
			if len(recs) > 0 || marker.Offset >= 0 {
				polled = append(polled, polledPartition{topicPartition{fp.Topic, fp.Partition}, recs, marker, fp.HighWatermark})
			}
		})

		got := 0
		f.mu.Lock()
		for _, pr := range polled {
			ps := f.parts[pr.tp]
			if ps == nil {
				ps = newPartitionState(pr.tp, f.budget)
				f.parts[pr.tp] = ps
			}
			got += ps.add(pr.recs)
			ps.addMarker(pr.marker)
			f.setLagLocked(pr.tp, pr.hwm-ps.nextFetch)
		}
		if len(polled) > 0 {
			f.polls++
		}
		f.mu.Unlock()
		// franz-go stops fetching a partition at a batch the decompressor
		// refused until we move its cursor past the batch, which must
		// happen before a rebalance can revoke the partition.
		cl.SetOffsets(skips)
		cl.AllowRebalance()
		if got > 0 {
			f.signal()
			clear(loggedErrs)
		}

		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, kgo.ErrMaxDecompress) {
				return // nothing to retry, or skipped above
			}
			msg := fmt.Sprintf("fetching %s/%d: %v", topic, partition, err)
			if topic == "" {
				// Not a partition's: franz-go passes the group's
				// errors (a join the broker refuses) this way.
				msg = fmt.Sprintf("group %q: %v", f.group, err)
			}
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
// has checkpoint_limit records read ahead, or the input holds its whole
// byte budget. Not polling leaves the next records in franz-go's buffer (at
// most one fetch per broker), which stops fetching altogether until we poll
// again. It reports false when ctx ends.
func (f *franzInput) waitForRoom(ctx context.Context) bool {
	for {
		f.mu.Lock()
		full := f.budget.full()
		for _, ps := range f.parts {
			if full {
				break
			}
			full = len(ps.pending) >= f.checkpointLimit
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

// commitLoop commits every commit_period and, when no poll brought records
// since the last tick, refreshes the lag gauge from the brokers.
func (f *franzInput) commitLoop(ctx context.Context, cl *kgo.Client) *periodic.Loop {
	var lastPolls uint64
	return periodic.Start(ctx, periodic.Config{Interval: f.commitPeriod}, func(ctx context.Context) {
		f.commitPeriodic(ctx, cl)
		f.mu.Lock()
		polls := f.polls
		f.mu.Unlock()
		if polls == lastPolls {
			f.refreshLag(ctx, cl)
		}
		lastPolls = polls
	})
}

// commitPeriodic commits the commit points that moved. A revoke abandons
// it (see onRevoked).
func (f *franzInput) commitPeriodic(ctx context.Context, cl *kgo.Client) {
	cctx, cancel := context.WithTimeout(ctx, f.commitTimeout)
	defer cancel()
	f.mu.Lock()
	offsets := f.committableLocked(nil)
	f.cancelPeriodic = cancel
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.cancelPeriodic = nil
		f.mu.Unlock()
	}()
	// franz-go issues commits one at a time in the order they were
	// asked for, and calls this function just before issuing ours. If a
	// revoke has abandoned this commit by then, it is not issued: the
	// revoke's own commit may have gone first, and ours, computed before
	// it, must not land after it with older offsets.
	f.commit(kgo.PreCommitFnContext(cctx, func(*kmsg.OffsetCommitRequest) error { return cctx.Err() }), cl, offsets, "periodic")
}

// commitAll commits the commit point of every partition that moved.
func (f *franzInput) commitAll(ctx context.Context, cl *kgo.Client, why string) {
	f.mu.Lock()
	offsets := f.committableLocked(nil)
	f.mu.Unlock()
	f.commit(ctx, cl, offsets, why)
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

// commit commits offsets synchronously, within ctx, and records what the
// group accepted. A failed commit is logged and tried again at the next
// commit_period (or, for a revoke, left to the next owner, who reads from
// the previous commit).
func (f *franzInput) commit(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]kgo.EpochOffset, why string) {
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
		f.commitWarns.Warn(why, fmt.Sprintf("kafka_franz: %s commit of group %q failed: %v", why, f.group, reqErr))
	case len(failed) > 0:
		f.commitWarns.Warn(why, fmt.Sprintf("kafka_franz: %s commit of group %q failed for %s", why, f.group, strings.Join(failed, ", ")))
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

func (f *franzInput) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	f.expired.assigned(cl)
	f.mu.Lock()
	f.countOwnedLocked(assigned, 1)
	f.mu.Unlock()
	if len(assigned) > 0 {
		f.logRebalance("assigned", assigned)
	}
}

// logRebalance logs partitions assigned, revoked or lost. The fields say the
// same as the message for tools that follow the log (the dev stack's screen
// shows rebalances).
func (f *franzInput) logRebalance(event string, partitions map[string][]int32) {
	parts := formatPartitions(partitions)
	l := f.log.With("kafka_rebalance", event, "kafka_group", f.group, "kafka_partitions", parts)
	if event == "lost" {
		l.Warnf("kafka_franz: lost partitions %s; records after their last commit will be consumed again", parts)
		return
	}
	l.Infof("kafka_franz: %s partitions %s", event, parts)
}

// onRevoked commits what is safe to commit for the revoked partitions and
// forgets them. Records of theirs still in the pipeline are not waited for:
// their acks are ignored and the next owner reads them again from the
// commit point (at-least-once).
//
// franz-go runs one commit at a time, so a periodic commit in flight would
// hold ours back: it is abandoned first. Our commit then gets commitTimeout
// at most, so a broker that does not answer cannot keep this member from
// rejoining within the rebalance timeout.
func (f *franzInput) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	// Take the commit points and forget the partitions at once: an ack
	// arriving after this is not committed by us.
	f.expired.forget(revoked)
	f.mu.Lock()
	offsets := f.committableLocked(revoked)
	f.dropLocked(revoked)
	f.countOwnedLocked(revoked, -1)
	abandonPeriodic := f.cancelPeriodic
	f.mu.Unlock()
	if abandonPeriodic != nil {
		abandonPeriodic()
	}
	cctx, cancel := context.WithTimeout(ctx, f.commitTimeout)
	f.commit(cctx, cl, offsets, "revoke")
	cancel()
	f.logRebalance("revoked", revoked)
}

// onLost forgets partitions that were taken away without a clean revoke: a
// commit would be rejected, and nothing past the last commit is lost since
// the next owner starts there.
func (f *franzInput) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 {
		return
	}
	f.expired.forget(lost)
	f.mu.Lock()
	f.dropLocked(lost)
	f.countOwnedLocked(lost, -1)
	f.mu.Unlock()
	f.logRebalance("lost", lost)
}

// resetOwnedLocked sets every configured topic's count of assigned
// partitions to 0 (a member that has not joined, or has left).
func (f *franzInput) resetOwnedLocked() {
	f.owned = make(map[string]int, len(f.topics))
	for _, t := range f.topics {
		f.owned[t] = 0
		f.assigned.Set(0, t)
	}
}

// countOwnedLocked adds (sign 1) or takes away (-1) partitions from the
// counts of assigned partitions.
func (f *franzInput) countOwnedLocked(parts map[string][]int32, sign int) {
	for topic, ps := range parts {
		n := max(f.owned[topic]+sign*len(ps), 0)
		f.owned[topic] = n
		f.assigned.Set(int64(n), topic)
	}
}

// dropLocked forgets the partitions. Their lag drops to 0: it is another
// member's to report now.
func (f *franzInput) dropLocked(parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := f.parts[tp]; st != nil {
				st.drop()
				delete(f.parts, tp)
				f.setLagLocked(tp, 0)
			}
		}
	}
	f.roomFreed()
}

// setLagLocked sets the lag gauge of a partition. It runs under mu, so a
// value computed before a revoke cannot land after the revoke's 0.
func (f *franzInput) setLagLocked(tp topicPartition, lag int64) {
	f.lag.Set(max(lag, 0), tp.topic, strconv.Itoa(int(tp.partition)))
}

// refreshLag computes the lag from the brokers' high watermarks when no
// fetch brought them lately: while the pipeline is stalled the poll loop
// does not poll, and the lag keeps growing unseen.
func (f *franzInput) refreshLag(ctx context.Context, cl *kgo.Client) {
	f.mu.Lock()
	topics := make(map[string]bool)
	for tp, ps := range f.parts {
		if ps.nextFetch >= 0 {
			topics[tp.topic] = true
		}
	}
	f.mu.Unlock()
	if len(topics) == 0 {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, f.commitTimeout)
	defer cancel()
	// A kadm client over ours: closing it would close ours, so it is not.
	ends, err := kadm.NewClient(cl).ListEndOffsets(lctx, slices.Collect(maps.Keys(topics))...)
	if err != nil {
		f.log.Debugf("kafka_franz: listing end offsets for the lag: %v", err)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ends.Each(func(o kadm.ListedOffset) {
		tp := topicPartition{o.Topic, o.Partition}
		if ps := f.parts[tp]; o.Err == nil && ps != nil && ps.nextFetch >= 0 {
			f.setLagLocked(tp, o.Offset-ps.nextFetch)
		}
	})
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
