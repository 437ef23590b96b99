package kafka

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputReportsRecordsDeletedBeforeTheyWereRead: a group committed
// offset 5 of ten records, then the topic's retention deleted everything
// below 8 while nothing consumed. The input says so at ERROR with the range
// lost, counts the three records, and goes on from the log start.
func TestInputReportsRecordsDeletedBeforeTheyWereRead(t *testing.T) {
	t.Parallel()
	const topic, group = "expired", "g-expired"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 10, nil)
	ctx := context.Background()
	var committed, deleteBelow kadm.Offsets
	committed.Add(kadm.Offset{Topic: topic, Partition: 0, At: 5, LeaderEpoch: -1})
	deleteBelow.Add(kadm.Offset{Topic: topic, Partition: 0, At: 8})
	if resp, err := c.Admin(t).CommitOffsets(ctx, group, committed); err != nil || resp.Error() != nil {
		t.Fatalf("committing offset 5: %v %v", err, resp.Error())
	}
	if resp, err := c.Admin(t).DeleteRecords(ctx, deleteBelow); err != nil || resp.Error() != nil {
		t.Fatalf("deleting records below 8: %v %v", err, resp.Error())
	}

	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "offsets 8 and 9", func() bool { return s.ackedCount() == 2 })
	for o := int64(8); o < 10; o++ {
		if !s.isAcked(offsetKey{topic, 0, o}) {
			t.Errorf("offset %d not delivered", o)
		}
	}
	if n, _ := ts.gauges.get(metricRecordsExpired); n != 3 {
		t.Errorf("%s = %d, want 3 (offsets 5 to 7)", metricRecordsExpired, n)
	}
	const want = `expired[0]: Kafka deleted offsets 5 to 7 before group \"g-expired\" read them (the topic's retention ran out): up to 3 messages never reached the outbox; consuming resumes at 8`
	if ts.logs.count(want) != 1 || ts.logs.count("level=ERROR") != 1 {
		t.Errorf("want one ERROR line saying %s:\n%s", want, ts.logs.String())
	}
}

// TestInputChecksThePartitionsOfTheBrokersThatAnswer: the same expired
// records on two partitions led by two brokers, and the second broker does
// not answer the look at the log starts. The first partition is still
// checked (ERROR, counted, resumed at its start); the second is named in a
// warning, and franz-go's own reset takes it to its start once its broker
// answers again.
func TestInputChecksThePartitionsOfTheBrokersThatAnswer(t *testing.T) {
	t.Parallel()
	const topic, group = "expired", "g-expired"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}}, kfake.NumBrokers(2))
	for p := range int32(2) {
		if err := c.MoveTopicPartition(topic, p, p); err != nil {
			t.Fatalf("moving partition %d to broker %d: %v", p, p, err)
		}
	}
	c.ProduceN(t, topic, 20, func(i int) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: int32(i % 2), Value: []byte{byte(i)}}
	})
	ctx := context.Background()
	var committed, deleteBelow kadm.Offsets
	for p := range int32(2) {
		committed.Add(kadm.Offset{Topic: topic, Partition: p, At: 5, LeaderEpoch: -1})
		deleteBelow.Add(kadm.Offset{Topic: topic, Partition: p, At: 8})
	}
	if resp, err := c.Admin(t).CommitOffsets(ctx, group, committed); err != nil || resp.Error() != nil {
		t.Fatalf("committing offset 5: %v %v", err, resp.Error())
	}
	if resp, err := c.Admin(t).DeleteRecords(ctx, deleteBelow); err != nil || resp.Error() != nil {
		t.Fatalf("deleting records below 8: %v %v", err, resp.Error())
	}

	// Broker 1 drops every ListOffsets request until the warning is out.
	var answering atomic.Bool
	c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if c.CurrentNode() != 1 || answering.Load() {
			return nil, nil, false
		}
		return nil, errors.New("broker 1 does not answer"), true
	})
	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	const warning = "could not read the log start of expired[1] to check for records deleted before group"
	waitFor(t, "the warning about partition 1", func() bool { return ts.logs.count(warning) == 1 })
	answering.Store(true)

	waitFor(t, "offsets 8 and 9 of both partitions", func() bool { return s.ackedCount() == 4 })
	for p := range int32(2) {
		for o := int64(8); o < 10; o++ {
			if !s.isAcked(offsetKey{topic, p, o}) {
				t.Errorf("partition %d offset %d not delivered", p, o)
			}
		}
	}
	if n, _ := ts.gauges.get(metricRecordsExpired); n != 3 {
		t.Errorf("%s = %d, want 3 (offsets 5 to 7 of partition 0 only)", metricRecordsExpired, n)
	}
	const lost = `expired[0]: Kafka deleted offsets 5 to 7 before group \"g-expired\" read them`
	if ts.logs.count(lost) != 1 || ts.logs.count("level=ERROR") != 1 || ts.logs.count("check for records deleted") != 1 {
		t.Errorf("want one ERROR line for partition 0 and one warning for partition 1 only:\n%s", ts.logs.String())
	}
}

// TestInputReportsRecordsDeletedWhileItReads: the group has read offsets
// 0 to 4 when the retention deletes everything below 8 before its next
// fetch (held by the broker until then). franz-go resumes at the log start
// with a line of its own; the input says at ERROR which offsets were lost
// and counts them.
func TestInputReportsRecordsDeletedWhileItReads(t *testing.T) {
	t.Parallel()
	const topic, group = "overtaken", "g-overtaken"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 5, nil)

	// The fetch at offset 5 waits until records 5 to 9 exist and 0 to 7
	// are deleted.
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if rp.FetchOffset == 5 {
					once.Do(func() {
						close(held)
						c.SleepControl(func() { <-release })
					})
				}
			}
		}
		return nil, nil, false
	})
	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "offsets 0 to 4", func() bool { return s.ackedCount() == 5 })
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("no fetch at offset 5")
	}
	c.ProduceN(t, topic, 5, nil)
	var deleteBelow kadm.Offsets
	deleteBelow.Add(kadm.Offset{Topic: topic, Partition: 0, At: 8})
	if resp, err := c.Admin(t).DeleteRecords(context.Background(), deleteBelow); err != nil || resp.Error() != nil {
		t.Fatalf("deleting records below 8: %v %v", err, resp.Error())
	}
	close(release)

	waitFor(t, "offsets 8 and 9", func() bool { return s.ackedCount() == 7 })
	for o := int64(8); o < 10; o++ {
		if !s.isAcked(offsetKey{topic, 0, o}) {
			t.Errorf("offset %d not delivered", o)
		}
	}
	if n, _ := ts.gauges.get(metricRecordsExpired); n != 3 {
		t.Errorf("%s = %d, want 3 (offsets 5 to 7)", metricRecordsExpired, n)
	}
	const want = `overtaken[0]: Kafka deleted offsets 5 to 7 before group \"g-overtaken\" read them (the topic's retention overtook the consumer): up to 3 messages never reached the outbox; consuming resumed at 8`
	if ts.logs.count(want) != 1 || ts.logs.count("level=ERROR") != 1 {
		t.Errorf("want one ERROR line saying %s:\n%s", want, ts.logs.String())
	}
}
