package kafka

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputReadsATopicCreatedAgain: the group has read and committed five
// records when the topic is deleted and created again, and three records
// are written to the new topic. franz-go alone would never read the new
// topic (it keeps the old topic's ID); the input subscribes to it again,
// reads it from its oldest record (the old partition's offset 5, committed
// as it is revoked, would land on the new topic and skip them), and commits
// its progress there (at shutdown: the commit period is an hour).
func TestInputReadsATopicCreatedAgain(t *testing.T) {
	t.Parallel()
	const topic, group = "recreated", "g-recreated"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 5, nil)
	s := newSink(t)
	// Nothing is committed before the revoke.
	ts := startStream(t, s, 1, strings.Replace(inputConf(c, topic, group), "commit_period: 50ms", "commit_period: 1h", 1))
	waitFor(t, "offsets 0 to 4", func() bool { return s.ackedCount() == 5 })

	ctx := context.Background()
	if _, err := c.Admin(t).DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin(t).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// A client that never saw the old topic: the cluster's producer keeps
	// its ID.
	producer := c.Client(t)
	for range 3 {
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("new")}).FirstErr(); err != nil {
			t.Fatalf("producing to the new topic: %v", err)
		}
	}

	waitFor(t, "the new topic assigned", func() bool {
		return ts.logs.count("reading the new topic recreated from its oldest record") == 1
	})
	if got, ok := c.Committed(t, group)[topic][0]; ok {
		t.Errorf("the old partition's offset %d was committed, for the new topic", got)
	}
	waitFor(t, "the new topic's offsets 0 to 2", func() bool {
		for o := range int64(3) {
			if s.deliveries(offsetKey{topic, 0, o}) != 2 {
				return false
			}
		}
		return true
	})
	if n := s.deliveries(offsetKey{topic, 0, 3}); n != 1 {
		t.Errorf("offset 3 delivered %d times, want once (the old topic's)", n)
	}
	if n := ts.logs.count("kafka_franz: topic recreated was deleted and created again"); n != 1 {
		t.Errorf("want one warning saying the topic was created again, got %d:\n%s", n, ts.logs.String())
	}
	ts.stop(waitTimeout)
	if got := c.Committed(t, group)[topic][0]; got != 3 {
		t.Errorf("the group committed %d for the new topic, want 3 (its progress)", got)
	}
}

// TestResubscribeForgetsTheOldPartitions: subscribing to a recreated topic
// again forgets its old partitions itself. franz-go reports them to
// onRevoked only when the purge ends the group session; once a heartbeat
// had ended it first, the revoke came empty, and the old partition's state,
// at the old topic's offset 5, skipped the new topic's offsets 0 to 2 as
// already fetched (TestInputReadsATopicCreatedAgain, once in CI). Here the
// client is in no group, so franz-go reports nothing: the input must.
func TestResubscribeForgetsTheOldPartitions(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t, []kafkatest.Topic{{Name: "recreated", Partitions: 2}, {Name: "kept", Partitions: 1}})
	f := newInput(t, inputConf(c, "recreated", "g-forget"), nil)
	f.budget = &byteBudget{limit: f.maxBufferedBytes} // as Connect does
	old := map[topicPartition]*partitionState{}
	f.mu.Lock()
	f.resetOwnedLocked()
	for _, tp := range []topicPartition{{"recreated", 0}, {"recreated", 1}, {"kept", 0}} {
		ps := newPartitionState(tp, f.budget)
		ps.nextFetch = 5
		f.parts[tp], old[tp] = ps, ps
	}
	f.owned["recreated"] = 2
	f.mu.Unlock()

	f.recreated.add("recreated")
	f.resubscribe(c.Client(t))

	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tp := range []topicPartition{{"recreated", 0}, {"recreated", 1}} {
		if f.parts[tp] != nil || !old[tp].dead {
			t.Errorf("%v: the old topic's partition is still held (dead %v): the new topic's records below offset 5 would be skipped", tp, old[tp].dead)
		}
	}
	if f.parts[topicPartition{"kept", 0}] != old[topicPartition{"kept", 0}] || old[topicPartition{"kept", 0}].dead {
		t.Errorf("another topic's partition was forgotten")
	}
	if f.owned["recreated"] != 0 {
		t.Errorf("the recreated topic still counts %d partitions assigned, want 0", f.owned["recreated"])
	}
}

// TestRecreatedTopicsStartOver: a topic subscribed to again is read from
// the log start when assigned within startOverWindow, whatever the group
// committed for it; other topics, and the same topic after the window, keep
// their offsets.
func TestRecreatedTopicsStartOver(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &recreatedTopics{now: func() time.Time { return now }}
	r.add("vehicle")
	r.add("vehicle")
	if got := r.take(); !slices.Equal(got, []string{"vehicle"}) {
		t.Fatalf("take() = %v, want [vehicle] once", got)
	}
	committed := func() map[string]map[int32]kgo.Offset {
		return map[string]map[int32]kgo.Offset{
			"vehicle":   {0: kgo.NewOffset().At(5), 1: kgo.NewOffset().At(7)},
			"heartbeat": {0: kgo.NewOffset().At(9)},
		}
	}
	for _, tc := range []struct {
		after time.Duration
		want  []string
	}{{0, []string{"vehicle"}}, {startOverWindow - time.Second, []string{"vehicle"}}, {startOverWindow, nil}} {
		now = time.Unix(1_800_000_000, 0).Add(tc.after)
		offsets := committed()
		if got := r.startOver(offsets); !slices.Equal(got, tc.want) {
			t.Fatalf("%v after: startOver restarted %v, want %v", tc.after, got, tc.want)
		}
		for topic, parts := range offsets {
			for p, o := range parts {
				atStart := o.EpochOffset().Offset == -2
				if want := slices.Contains(tc.want, topic); atStart != want {
					t.Errorf("%v after: %s[%d] at %v, want the log start: %v", tc.after, topic, p, o, want)
				}
			}
		}
	}
}

// TestInputWarnsOfATopicThatDoesNotExist: of two configured topics, one
// does not exist (a typo, or not created yet). The input says so once at
// start, reads the other, and reads the missing one once it is created,
// within metadata_max_age. The partitions-assigned gauge shows each
// topic's count, 0 for the missing one, and 0 again for both once the
// member has left.
func TestInputWarnsOfATopicThatDoesNotExist(t *testing.T) {
	t.Parallel()
	const group = "g-missing"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: "present", Partitions: 1}})
	c.ProduceN(t, "present", 1, nil)
	s := newSink(t)
	conf := fmt.Sprintf("seed_brokers: [ %q ]\ntopics: [ present, absent ]\nconsumer_group: %s\ncommit_period: 50ms\nmetadata_max_age: 5s\n", c.Brokers(), group)
	ts := startStream(t, s, 1, conf)
	waitFor(t, "the present topic's record", func() bool { return s.isAcked(offsetKey{"present", 0, 0}) })
	const want = `kafka_franz: topic \"absent\" does not exist: group \"g-missing\" reads nothing from it until it is created`
	if ts.logs.count(want) != 1 || ts.logs.count("level=WARN") != 1 {
		t.Errorf("want one warning saying %s:\n%s", want, ts.logs.String())
	}
	assigned := func(topic string) int64 {
		n, ok := ts.gauges.get(metricID(metricPartitionsAssigned, []string{"topic"}, []string{topic}))
		if !ok {
			return -1
		}
		return n
	}
	if p, a := assigned("present"), assigned("absent"); p != 1 || a != 0 {
		t.Errorf("partitions assigned: present %d, absent %d; want 1 and 0", p, a)
	}

	if _, err := c.Admin(t).CreateTopic(context.Background(), 1, 1, nil, "absent"); err != nil {
		t.Fatal(err)
	}
	c.ProduceN(t, "absent", 1, nil)
	waitFor(t, "the created topic's record", func() bool { return s.isAcked(offsetKey{"absent", 0, 0}) })
	if a := assigned("absent"); a != 1 {
		t.Errorf("partitions assigned of the created topic: %d, want 1", a)
	}
	ts.stop(waitTimeout)
	if p, a := assigned("present"), assigned("absent"); p != 0 || a != 0 {
		t.Errorf("partitions assigned after leaving: present %d, absent %d; want 0 and 0", p, a)
	}
}

// TestInputWarnsOnceAMinuteOfCommitsToADeletedTopic: while a topic is
// deleted, every periodic commit of its partitions fails (here every
// 50ms); the first failure is a warning, the next ones within the minute
// are counted and summed up when the member leaves.
func TestInputWarnsOnceAMinuteOfCommitsToADeletedTopic(t *testing.T) {
	t.Parallel()
	const topic, group = "deleted", "g-deleted"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 2, nil)
	s := newSink(t)
	// The sink holds the ack of a third record until the topic is gone,
	// so that the commit point moves when no commit can succeed.
	deleted := make(chan struct{})
	s.write = func(_ context.Context, _ service.MessageBatch, offsets []offsetKey) error {
		if slices.Contains(offsets, offsetKey{topic, 0, 2}) {
			<-deleted
		}
		return nil
	}
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "offsets 0 and 1 committed", func() bool { return c.Committed(t, group)[topic][0] == 2 })
	c.ProduceN(t, topic, 1, nil)
	waitFor(t, "offset 2 read", func() bool { return s.deliveries(offsetKey{topic, 0, 2}) == 1 })
	if _, err := c.Admin(t).DeleteTopic(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	close(deleted)
	const failed = `kafka_franz: periodic commit of group \"g-deleted\" failed`
	waitFor(t, "the first failed commit", func() bool { return ts.logs.count(failed) == 1 })
	time.Sleep(time.Second) // twenty more commit periods
	if n := ts.logs.count(failed); n != 1 {
		t.Errorf("%d warnings of failed periodic commits in a second, want 1", n)
	}
	ts.stop(waitTimeout)
	if n := ts.logs.count("more like it"); n == 0 {
		t.Errorf("the failed commits after the first were not summed up at close:\n%s", ts.logs.String())
	}
}
