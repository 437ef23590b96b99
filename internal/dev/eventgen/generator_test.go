package eventgen_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newKafka(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(3, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// consume reads n records from both topics.
func consume(t *testing.T, brokers []string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(recs), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

// recordID tells records apart, a null value from an empty one included.
func recordID(topic string, key, value []byte) string {
	return fmt.Sprintf("%s|%s|%q|%v", topic, key, value, value == nil)
}

func TestGenerator(t *testing.T) {
	t.Parallel()

	t.Run("ProducesCountToBothTopics", func(t *testing.T) {
		t.Parallel()
		kafka := newKafka(t)
		var mu sync.Mutex
		sent := map[string]eventgen.Flaw{}
		g, err := eventgen.New(eventgen.Config{
			SourceConfig: eventgen.SourceConfig{Seed: 3, DuplicateRate: 0.1, MalformedRate: 0.1},
			Brokers:      kafka.ListenAddrs(),
			Count:        500,
			OnProduced: func(m eventgen.Message, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
					return
				}
				mu.Lock()
				sent[recordID(m.Topic, m.Key, m.Value)] = m.Flaw
				mu.Unlock()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := g.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := g.Stats()
		if st.Produced != 500 || st.Vehicle+st.Heartbeat != 500 || st.Deliverable+st.Duplicates+st.Malformed != 500 || st.Errors != 0 {
			t.Fatalf("stats %+v don't add up to 500", st)
		}
		if st.Duplicates == 0 || st.Malformed == 0 || st.Heartbeat == 0 {
			t.Errorf("stats %+v: want some of each", st)
		}
		recs := consume(t, kafka.ListenAddrs(), 500)
		topics := map[string]int64{}
		for _, r := range recs {
			topics[r.Topic]++
			if _, ok := sent[recordID(r.Topic, r.Key, r.Value)]; !ok {
				t.Fatalf("record on %s key %s was not reported as produced: %q (nil %v)", r.Topic, r.Key, r.Value, r.Value == nil)
			}
		}
		if topics[eventgen.DefaultVehicleTopic] != st.Vehicle || topics[eventgen.DefaultHeartbeatTopic] != st.Heartbeat {
			t.Errorf("topics %v, stats %+v", topics, st)
		}
	})

	t.Run("StopsWhenContextEnds", func(t *testing.T) {
		t.Parallel()
		kafka := newKafka(t)
		first := make(chan struct{})
		var once sync.Once
		g, err := eventgen.New(eventgen.Config{
			Brokers:    kafka.ListenAddrs(),
			Rate:       20,
			OnProduced: func(eventgen.Message, error) { once.Do(func() { close(first) }) },
		})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		<-first
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
		// Everything handed to Kafka before the cancel was flushed, not
		// dropped as cancelled.
		if st := g.Stats(); st.Produced == 0 || st.Errors != 0 {
			t.Errorf("stats %+v, want the produced messages acknowledged", st)
		}
	})

	t.Run("ReportsUnreachableKafka", func(t *testing.T) {
		t.Parallel()
		g, err := eventgen.New(eventgen.Config{
			Brokers:    []string{"127.0.0.1:1"},
			Count:      3,
			ClientOpts: []kgo.Opt{kgo.RecordDeliveryTimeout(time.Second)},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := g.Run(context.Background()); err == nil {
			t.Fatal("Run succeeded with no Kafka")
		}
	})

	t.Run("RejectsBadConfig", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []eventgen.Config{{}, {Brokers: []string{"x:1"}, Rate: -1}} {
			if g, err := eventgen.New(cfg); err == nil {
				g.Close()
				t.Errorf("New(%+v) accepted", cfg)
			}
		}
	})
}
