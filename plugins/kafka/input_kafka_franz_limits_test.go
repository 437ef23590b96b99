package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputByteBudget drives the input directly, acking nothing until it
// stops handing out batches, then acking the oldest batch: what is in the
// pipeline unacknowledged never exceeds max_buffered_bytes (a record larger
// than the budget goes alone), and what the input holds, read ahead
// included, never exceeds the budget plus one record. With checkpoint_limit
// 1 each poll returns one record, so the read-ahead cannot overshoot by
// more; eight partitions let the byte budget, not checkpoint_limit, decide.
func TestInputByteBudget(t *testing.T) {
	t.Parallel()
	const (
		topic  = "budget"
		group  = "g-budget"
		budget = 1 << 20
		small  = 256 << 10
		big    = 3 << 20 // larger than the budget
	)
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 8}})
	c.ProduceN(t, topic, 24, func(i int) *kgo.Record { return &kgo.Record{Value: bytes.Repeat([]byte{byte(i)}, small)} })
	c.ProduceN(t, topic, 1, func(int) *kgo.Record { return &kgo.Record{Value: bytes.Repeat([]byte{'B'}, big)} })
	const total = 25

	f := newInput(t, inputConf(c, topic, group, "checkpoint_limit: 1", fmt.Sprintf("max_buffered_bytes: %dB", budget)), nil)
	ctx := context.Background()
	if err := f.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close(ctx) })

	// What the input holds, sampled as it runs.
	var maxHeld atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			f.mu.Lock()
			held := f.budget.readAhead + f.budget.inFlight
			f.mu.Unlock()
			if held > maxHeld.Load() {
				maxHeld.Store(held)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	type inFlight struct {
		bytes int
		ack   service.AckFunc
	}
	var (
		unacked      []inFlight
		delivered    int
		bigDelivered bool
	)
	deadline := time.Now().Add(waitTimeout)
	for delivered < total {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d records delivered", delivered, total)
		}
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		batch, ack, err := f.ReadBatch(rctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			// Nothing more until an ack: free the oldest batch.
			if len(unacked) > 0 {
				_ = unacked[0].ack(ctx, nil)
				unacked = unacked[1:]
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range batch {
			b, _ := m.AsBytes()
			n += len(b)
			if len(b) == big {
				bigDelivered = true
				if len(batch) != 1 || len(unacked) != 0 {
					t.Errorf("the record larger than the budget came in a batch of %d with %d batches unacked; it must go alone", len(batch), len(unacked))
				}
			}
		}
		delivered += len(batch)
		unacked = append(unacked, inFlight{n, ack})
		sum := 0
		for _, u := range unacked {
			sum += u.bytes
		}
		if sum > budget && len(unacked) > 1 {
			t.Fatalf("%d bytes in %d batches unacked, over max_buffered_bytes %d", sum, len(unacked), budget)
		}
	}
	close(stop)
	<-sampled
	if !bigDelivered {
		t.Fatal("the record larger than the budget was never delivered")
	}
	if got := maxHeld.Load(); got > budget+big {
		t.Errorf("the input held %d bytes, over max_buffered_bytes %d plus one record (%d)", got, budget, big)
	}
}

// TestInputBatchingPolicy checks that a batching policy groups what the
// input hands out the way Benthos's policies group messages elsewhere.
func TestInputBatchingPolicy(t *testing.T) {
	t.Parallel()

	// run consumes total records of one partition through a stream with
	// the given extra input config, and waits for the commit of them all.
	run := func(t *testing.T, total int, s *sink, extra ...string) *testStream {
		t.Helper()
		topic, group := "policy", "g-policy"
		c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
		c.ProduceN(t, topic, total, nil)
		ts := startStream(t, s, 1, inputConf(c, topic, group, extra...))
		waitFor(t, "the commit of every record", func() bool { return c.Committed(t, group)[topic][0] == int64(total) })
		ts.stop(10 * time.Second)
		return ts
	}
	batchSizes := func(s *sink) *[]int {
		var (
			mu    sync.Mutex
			sizes []int
		)
		s.write = func(_ context.Context, b service.MessageBatch, _ []offsetKey) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(b))
			return nil
		}
		return &sizes
	}

	t.Run("CountOneGivesOneRecordPerBatch", func(t *testing.T) {
		t.Parallel()
		s := newSink(t)
		sizes := batchSizes(s)
		run(t, 10, s, "batching:\n  count: 1")
		for _, n := range *sizes {
			if n != 1 {
				t.Fatalf("batch sizes %v with count: 1", *sizes)
			}
		}
	})

	t.Run("FlushedEarlyAtCheckpointLimit", func(t *testing.T) {
		t.Parallel()
		// A count above checkpoint_limit can never be reached: the batch
		// goes when its partition is at the limit, or it would wait for
		// an ack that cannot come.
		s := newSink(t)
		sizes := batchSizes(s)
		run(t, 20, s, "checkpoint_limit: 10", "batching:\n  count: 25")
		if fmt.Sprint(*sizes) != "[10 10]" {
			t.Fatalf("batch sizes %v, want [10 10]", *sizes)
		}
	})

	t.Run("ProcessorsRunOnEachBatch", func(t *testing.T) {
		t.Parallel()
		s := newSink(t)
		s.keepMsgs = true
		run(t, 20, s, "batching:\n  count: 5\n  processors:\n    - archive:\n        format: json_array")
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.msgs) != 4 {
			t.Fatalf("%d messages, want 4 archives of 5", len(s.msgs))
		}
		for _, m := range s.msgs {
			b, _ := m.AsBytes()
			var values []any
			if err := json.Unmarshal(b, &values); err != nil || len(values) != 5 {
				t.Errorf("archive %s, want a JSON array of 5 values", b)
			}
		}
	})

	t.Run("FilteredOutCountsAsDelivered", func(t *testing.T) {
		t.Parallel()
		s := newSink(t)
		run(t, 20, s, "batching:\n  count: 5\n  processors:\n    - mapping: 'root = deleted()'")
		if n := s.ackedCount(); n != 0 {
			t.Fatalf("%d records reached the output; the batching processors dropped them all", n)
		}
	})
}

// TestInputConsumerLag checks forwarder_kafka_consumer_lag: the high
// watermark minus the next offset the input reads, from fetches while they
// flow and from the brokers while the pipeline is stalled.
func TestInputConsumerLag(t *testing.T) {
	t.Parallel()
	const topic, group = "lag", "g-lag"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 100, nil)

	// The output holds everything until released: with checkpoint_limit
	// 10 the input hands out offsets 0-9 and reads 10-19 ahead, then
	// stops polling, so the next offset it reads is 20.
	release := make(chan struct{})
	s := newSink(t)
	s.write = func(ctx context.Context, _ service.MessageBatch, _ []offsetKey) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ts := startStream(t, s, 1, inputConf(c, topic, group, "checkpoint_limit: 10", "batching:\n  count: 10"))
	const id = metricConsumerLag + ",topic=" + topic + ",partition=0"
	lagIs := func(want int64) func() bool {
		return func() bool {
			got, ok := ts.gauges.get(id)
			return ok && got == want
		}
	}
	waitFor(t, "lag 80 (100 records, the next read at 20)", lagIs(80))

	// Nothing is polled while the output holds the records, yet the lag
	// follows what producers add.
	c.ProduceN(t, topic, 50, nil)
	waitFor(t, "lag 130 after 50 more records", lagIs(130))

	close(release)
	waitFor(t, "lag 0 once everything is consumed", lagIs(0))
	waitFor(t, "the commit of every record", func() bool { return c.Committed(t, group)[topic][0] == 150 })
	ts.stop(10 * time.Second)
}
