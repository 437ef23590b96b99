package kafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// franzRecreated starts the warning franz-go logs when a topic it consumes
// comes back from the brokers under a new topic ID: it was deleted and
// created again. franz-go then stops consuming it for good, until the topic
// is purged from the client and added back (its README, "Topic
// recreation").
const franzRecreated = "metadata has a new ID for a topic we already hold"

// startOverWindow is how long after a recreated topic is subscribed to
// again its partitions assigned to this member are read from the log start
// rather than from the group's commit, which may still be the old topic's.
const startOverWindow = 10 * time.Minute

// recreatedTopics follows the topics franz-go found recreated: noted by
// kgoLogger, subscribed to again by resubscribeLoop, and read from the log
// start when assigned soon after (startOver).
type recreatedTopics struct {
	// signal has a value while found holds topics.
	signal chan struct{}

	mu sync.Mutex
	// found are the topics to subscribe to again.
	found []string
	// old holds when each topic was subscribed to again: until
	// startOverWindow has passed, the offsets this member holds or the
	// group has committed for it may be the old topic's.
	old map[string]time.Time
	now func() time.Time
}

// add notes topic (from kgoLogger, on franz-go's metadata goroutine).
func (r *recreatedTopics) add(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.found, topic) {
		r.found = append(r.found, topic)
	}
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// take returns the topics found since the last call and counts them old.
func (r *recreatedTopics) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := r.found
	r.found = nil
	for _, t := range found {
		if r.old == nil {
			r.old = make(map[string]time.Time)
		}
		r.old[t] = r.clock()
	}
	return found
}

func (r *recreatedTopics) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// isOld reports whether offsets this member holds for topic may be the old
// topic's: it was subscribed to again within startOverWindow.
func (r *recreatedTopics) isOld(topic string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.old[topic]
	if ok && r.clock().Sub(at) >= startOverWindow {
		delete(r.old, topic)
		return false
	}
	return ok
}

// startOver sets to the log start the fetch offsets of the partitions of
// topics subscribed to again within startOverWindow, and returns those
// topics. The group's commit for such a topic may be the old topic's (a
// commit by name, from Kafka before 4.2, lands on whichever topic holds the
// name), and a stale offset would skip the new topic's first records.
// Reading from the start instead delivers again at most what other members
// read of the new topic meanwhile, which the outbox skips as redeliveries.
func (r *recreatedTopics) startOver(offsets map[string]map[int32]kgo.Offset) []string {
	var restarted []string
	for topic, parts := range offsets {
		if !r.isOld(topic) {
			continue
		}
		for p := range parts {
			parts[p] = kgo.NewOffset().AtStart() // an existing key: safe while ranging
		}
		restarted = append(restarted, topic)
	}
	slices.Sort(restarted)
	return restarted
}

// resubscribeLoop runs resubscribe whenever franz-go finds a topic
// recreated, until ctx ends.
func (f *franzInput) resubscribeLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.recreated.signal:
			f.resubscribe(cl)
		}
	}
}

// resubscribe takes the recreated topics back: each is purged from the
// client, which revokes its old partitions (onRevoked forgets them; their
// offsets, marked stale first, are not committed: they would land on the
// new topic), and added again, so that the group is assigned the new
// topic's partitions. Without it the topic would never be read again and
// nothing would show it: its lag stays that of the old partitions.
func (f *franzInput) resubscribe(cl *kgo.Client) {
	topics := f.recreated.take()
	if len(topics) == 0 {
		return
	}
	f.log.Warnf("kafka_franz: topic %s was deleted and created again: group %q leaves its old partitions and reads the new topic from its oldest record; records of the old topic not yet delivered were deleted with it",
		strings.Join(topics, ", "), f.group)
	f.mu.Lock()
	for tp, ps := range f.parts {
		if slices.Contains(topics, tp.topic) {
			ps.stale = true
		}
	}
	f.mu.Unlock()
	cl.PurgeTopicsFromClient(topics...)
	// The purge unassigns the old partitions, and franz-go reports them to
	// onRevoked when the purge ends the group session; when a heartbeat
	// ended the session first (REBALANCE_IN_PROGRESS), the revoke comes
	// empty. The old partitions' state, at the old topic's offsets, would
	// then take the new partitions' first records for ones already fetched
	// and skip them, and commit nothing (stale). So they are forgotten here,
	// whatever franz-go reports, before the new topic can be assigned.
	f.forgetTopics(topics)
	cl.AddConsumeTopics(topics...)
}

// forgetTopics forgets every partition of topics, as onLost does: nothing
// of theirs is committed or handed out any more, and none counts as
// assigned.
func (f *franzInput) forgetTopics(topics []string) {
	old := make(map[string][]int32)
	f.mu.Lock()
	for tp := range f.parts {
		if slices.Contains(topics, tp.topic) {
			old[tp.topic] = append(old[tp.topic], tp.partition)
		}
	}
	f.dropLocked(old)
	for _, topic := range topics {
		if _, ok := f.owned[topic]; ok {
			f.owned[topic] = 0
			f.assigned.Set(0, topic)
		}
	}
	f.mu.Unlock()
	f.expired.forget(old)
}

// adjustFetchOffsets is the group's kgo.AdjustFetchOffsetsFn: recreated
// topics start over, then the commits are checked for expired records.
func (f *franzInput) adjustFetchOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	if restarted := f.recreated.startOver(offsets); len(restarted) > 0 {
		f.log.Infof("kafka_franz: reading the new topic %s from its oldest record", strings.Join(restarted, ", "))
	}
	return f.expired.adjust(ctx, offsets)
}

// topicCheckTimeout bounds the look at which configured topics exist.
const topicCheckTimeout = 5 * time.Second

// warnMissingTopics warns of each configured topic the cluster does not
// have (a typo in KAFKA_TOPIC_VEHICLE, a topic not created yet). The group
// waits for it without a word from franz-go: nothing would be read from it
// and nothing would say so. It is read once it exists, within
// metadata_max_age.
func (f *franzInput) warnMissingTopics(ctx context.Context, cl *kgo.Client) {
	cctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	details, err := kadm.NewClient(cl).ListTopics(cctx, f.topics...)
	if err != nil {
		f.log.Debugf("kafka_franz: could not check that topics %s exist: %v", strings.Join(f.topics, ", "), err)
		return
	}
	for _, topic := range f.topics {
		if td, ok := details[topic]; ok && errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			f.log.Warnf("kafka_franz: topic %q does not exist: group %q reads nothing from it until it is created (check the topic's name)", topic, f.group)
		}
	}
}
