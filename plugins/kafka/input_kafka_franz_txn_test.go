package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputSkipsAbortedTransactions: a producer writes three records in a
// transaction it aborts (they must not be billed), then two in one it
// commits, then one outside any transaction. The input delivers the five
// committed records and none of the aborted ones, as a read_committed
// consumer does.
func TestInputSkipsAbortedTransactions(t *testing.T) {
	t.Parallel()
	const topic, group = "transactional", "g-transactional"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	ctx := context.Background()
	txn := c.Client(t, kgo.TransactionalID("camera-gateway"), kgo.DefaultProduceTopic(topic))
	inTxn := func(commit bool, values ...string) {
		t.Helper()
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
	inTxn(false, "aborted-1", "aborted-2", "aborted-3")
	inTxn(true, "committed-1", "committed-2")
	if err := c.Client(t).ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("plain")}).FirstErr(); err != nil {
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
