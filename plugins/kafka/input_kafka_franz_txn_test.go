package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// transactional returns a function that writes values to topic in one
// transaction of a transactional producer, committed or aborted.
func transactional(t *testing.T, c *kafkatest.Cluster, topic string) func(commit bool, values ...string) {
	txn := c.Client(t, kgo.TransactionalID("camera-gateway-"+topic), kgo.DefaultProduceTopic(topic))
	return func(commit bool, values ...string) {
		t.Helper()
		ctx := context.Background()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInputSkipsAbortedTransactions: a producer writes three records in a
// transaction it aborts (they must not be billed), then two in one it
// commits, then one outside any transaction. The input delivers the five
// committed records and none of the aborted ones, as a read_committed
// consumer does.
func TestInputSkipsAbortedTransactions(t *testing.T) {
	t.Parallel()
	const topic, group = "transactional", "g-transactional"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	inTxn := transactional(t, c, topic)
	inTxn(false, "aborted-1", "aborted-2", "aborted-3")
	inTxn(true, "committed-1", "committed-2")
	if err := c.Client(t).ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte("plain")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	s := newSink(t)
	s.keepMsgs = true
	startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "the committed records", func() bool { return s.ackedCount() >= 3 })
	time.Sleep(time.Second) // an aborted record would show by now
	var got []string
	s.mu.Lock()
	for _, m := range s.msgs {
		b, _ := m.AsBytes()
		got = append(got, string(b))
	}
	s.mu.Unlock()
	if len(got) != 3 || got[0] != "committed-1" || got[1] != "committed-2" || got[2] != "plain" {
		t.Errorf("delivered %q, want the committed records only: [committed-1 committed-2 plain]", got)
	}
}

// TestInputCommitsPastTransactionMarkers: each transaction ends with a
// marker, an offset of its own that no message stands for. The input
// commits past the marker once every record before it is acked, as a Java
// consumer's position does, so a partition whose last write ended a
// transaction is read to its end: committed at the high watermark, lag 0.
// An aborted transaction alone (three records no one may read, then its
// marker) is passed the same way.
func TestInputCommitsPastTransactionMarkers(t *testing.T) {
	t.Parallel()
	const topic, group = "markers", "g-markers"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	inTxn := transactional(t, c, topic)
	inTxn(false, "aborted-1", "aborted-2", "aborted-3") // offsets 0-2, marker 3

	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	const lagID = metricConsumerLag + ",topic=" + topic + ",partition=0"
	passed := func(end int64) func() bool {
		return func() bool {
			lag, ok := ts.gauges.get(lagID)
			return ok && lag == 0 && c.Committed(t, group)[topic][0] == end
		}
	}
	waitFor(t, "the aborted transaction passed: committed at 4, lag 0", passed(4))

	inTxn(true, "committed-1", "committed-2") // offsets 4-5, marker 6
	waitFor(t, "the committed transaction passed: committed at 7, lag 0", passed(7))
	if n := s.ackedCount(); n != 2 {
		t.Errorf("%d messages delivered, want the 2 committed records", n)
	}
	ts.stop(10 * time.Second)
}
