package kafka

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"

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
	const want = `expired[0]: Kafka deleted offsets 5 to 7 before group \"g-expired\" read them (the topic's retention ran out): 3 messages never reached the outbox; consuming resumes at 8`
	if ts.logs.count(want) != 1 || ts.logs.count("level=ERROR") != 1 {
		t.Errorf("want one ERROR line saying %s:\n%s", want, ts.logs.String())
	}
}
