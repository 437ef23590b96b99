package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// inputConf is the kafka_franz config the tests share; extra lines are
// appended.
func inputConf(c *kafkatest.Cluster, topic, group string, extra ...string) string {
	return fmt.Sprintf(`seed_brokers: [ %q ]
topics: [ %q ]
consumer_group: %q
commit_period: 50ms
`, c.Brokers(), topic, group) + strings.Join(extra, "\n")
}

// assertCommitsCovered fails if a committed offset of group passed a record
// that the sink never acked: every offset below the commit must be acked.
func assertCommitsCovered(t *testing.T, c *kafkatest.Cluster, group, topic string, acked map[offsetKey]bool) map[int32]int64 {
	t.Helper()
	committed := c.Committed(t, group)[topic]
	for p, upTo := range committed {
		for o := int64(0); o < upTo; o++ {
			if !acked[offsetKey{topic, p, o}] {
				t.Fatalf("partition %d committed at %d, but offset %d was never acked", p, upTo, o)
			}
		}
	}
	return committed
}

func TestInputAbruptStopAndRestart(t *testing.T) {
	t.Parallel()
	const (
		topic = "events"
		group = "g-abrupt"
		total = 10_000
	)
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 3}})
	c.ProduceN(t, topic, total, nil)

	// A slow output that acks batches out of order.
	slow := func(ctx context.Context, _ service.MessageBatch, _ []offsetKey) error {
		select {
		case <-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	conf := inputConf(c, topic, group, "checkpoint_limit: 300", "batching:\n  count: 20\n  period: 20ms")

	// Once a third of the records are acked, the first run's output freezes
	// itself and holds every batch it is given until the stream is stopped:
	// those batches are in flight, un-acked, when the stop comes. It freezes
	// from inside the write, not when the test next polls, because a run
	// starved of CPU's polling can otherwise see the whole topic consumed.
	var (
		held     atomic.Int32
		unfreeze = make(chan struct{})
	)
	first := newSink(t)
	first.write = func(ctx context.Context, b service.MessageBatch, offs []offsetKey) error {
		if first.ackedCount() < total/3 {
			return slow(ctx, b, offs)
		}
		held.Add(1)
		select {
		case <-unfreeze:
		case <-ctx.Done():
		}
		return errors.New("abandoned by the stop")
	}
	s1 := startStream(t, first, 8, conf)
	waitFor(t, "a commit", func() bool { return len(c.Committed(t, group)[topic]) > 0 })
	waitFor(t, "batches held in flight", func() bool { return held.Load() >= 4 })

	// No graceful drain: the held batches are abandoned un-acked.
	s1.stop(time.Millisecond)
	close(unfreeze)
	acked1 := first.ackedSet()
	if len(acked1) == total {
		t.Fatal("the first run consumed everything; the stop was not mid-way")
	}
	assertCommitsCovered(t, c, group, topic, acked1)

	second := newSink(t)
	second.write = slow
	s2 := startStream(t, second, 8, conf)
	waitFor(t, "every record to be acked by one run or the other", func() bool {
		for k := range second.ackedSet() {
			acked1[k] = true
		}
		return len(acked1) == total
	})
	s2.stop(20 * time.Second)

	for p, end := range c.EndOffsets(t, topic) {
		for o := range end {
			if !acked1[offsetKey{topic, p, o}] {
				t.Fatalf("record %d/%d was never delivered", p, o)
			}
		}
	}
	committed := assertCommitsCovered(t, c, group, topic, acked1)
	for p, end := range c.EndOffsets(t, topic) {
		if committed[p] != end {
			t.Errorf("partition %d committed at %d after a graceful stop, want the end %d", p, committed[p], end)
		}
	}
}

func TestInputOutOfOrderAcks(t *testing.T) {
	t.Parallel()
	const (
		topic = "ooo"
		group = "g-ooo"
	)
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 10, nil)

	release := map[int64]chan struct{}{3: make(chan struct{}), 4: make(chan struct{})}
	s := newSink(t)
	s.write = func(ctx context.Context, _ service.MessageBatch, offs []offsetKey) error {
		if ch, ok := release[offs[0].offset]; ok {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	ts := startStream(t, s, 16, inputConf(c, topic, group, "batching:\n  count: 1"))

	committedAt := func(want int64) func() bool {
		return func() bool {
			got, ok := c.Committed(t, group)[topic][0]
			if ok && got > want {
				t.Fatalf("committed offset %d, past un-acked offset %d", got, want)
			}
			return got == want
		}
	}
	waitFor(t, "offsets 0-2 and 5-9 to be acked", func() bool { return s.ackedCount() == 8 })
	waitFor(t, "commit at 3", committedAt(3))
	for _, o := range []int64{5, 6, 7, 8, 9} {
		if !s.isAcked(offsetKey{topic, 0, o}) {
			t.Fatalf("offset %d not acked", o)
		}
	}

	close(release[3])
	waitFor(t, "commit at 4", committedAt(4))
	close(release[4])
	waitFor(t, "commit at 10", committedAt(10))
	ts.stop(10 * time.Second)
}

func TestInputNackedBatchIsDeliveredAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, batching string }{
		{"OneRecordBatches", "count: 1"},
		{"PolicyBatches", "count: 5\n  period: 10ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic, group := "nack", "g-nack"
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
			c.ProduceN(t, topic, 20, nil)

			var once sync.Once
			s := newSink(t)
			s.keepMsgs = true
			s.write = func(_ context.Context, _ service.MessageBatch, offs []offsetKey) error {
				var err error
				for _, o := range offs {
					if o.offset == 7 {
						once.Do(func() { err = errors.New("rejected by test") })
					}
				}
				return err
			}
			// The processor changes every message: a replay must start
			// again from the record, not from the changed message.
			ts := startStream(t, s, 4, inputConf(c, topic, group, "batching:\n  "+tc.batching),
				"pipeline:\n  processors:\n    - mapping: 'root = content().string() + \"!\"'")

			waitFor(t, "all 20 records acked", func() bool { return s.ackedCount() == 20 })
			if n := s.deliveries(offsetKey{topic, 0, 7}); n < 2 {
				t.Fatalf("offset 7 delivered %d times, want at least 2 (once rejected, then again)", n)
			}
			waitFor(t, "commit at 20", func() bool { return c.Committed(t, group)[topic][0] == 20 })
			ts.stop(10 * time.Second)

			s.mu.Lock()
			for _, m := range s.msgs {
				b, _ := m.AsBytes()
				if o := msgOffset(t, m).offset; string(b) != fmt.Sprintf("%d!", o) {
					t.Errorf("offset %d delivered as %q, want %q", o, b, fmt.Sprintf("%d!", o))
				}
			}
			s.mu.Unlock()
		})
	}
}

// TestInputBatchSpansPartitions runs the input without a batching policy
// against a broker: records of several partitions that are read together go
// out in one batch, whose ack commits every partition in it and whose nack
// delivers every record in it again.
func TestInputBatchSpansPartitions(t *testing.T) {
	t.Parallel()
	const topic, group, perPartition = "spans", "g-spans", 50
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 3}})
	c.ProduceN(t, topic, 3*perPartition, nil)

	var (
		mu       sync.Mutex
		rejected []offsetKey // the first batch of several partitions, nacked once
	)
	s := newSink(t)
	s.write = func(_ context.Context, _ service.MessageBatch, offs []offsetKey) error {
		parts := map[int32]bool{}
		for _, o := range offs {
			parts[o.partition] = true
		}
		mu.Lock()
		defer mu.Unlock()
		if len(parts) > 1 && rejected == nil {
			rejected = offs
			return errors.New("rejected by test")
		}
		return nil
	}
	ts := startStream(t, s, 1, inputConf(c, topic, group))

	waitFor(t, "every record to be acked", func() bool { return s.ackedCount() == 3*perPartition })
	waitFor(t, "commits at the end of every partition", func() bool {
		committed := c.Committed(t, group)[topic]
		return committed[0] == perPartition && committed[1] == perPartition && committed[2] == perPartition
	})
	ts.stop(10 * time.Second)

	mu.Lock()
	defer mu.Unlock()
	if rejected == nil {
		t.Fatal("no batch carried records of more than one partition")
	}
	for _, o := range rejected {
		if n := s.deliveries(o); n < 2 {
			t.Errorf("record %v of the rejected batch delivered %d times, want at least 2", o, n)
		}
	}
}

func TestInputGroupMemberLeaves(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		batching string
		delay    time.Duration // per batch, so member A cannot finish before B joins
	}{
		// Batches of one partition each, by policy.
		"PolicyBatches": {"batching:\n  count: 10\n  period: 20ms", 2 * time.Millisecond},
		// Batches of every partition with records read.
		"FetchBatches": {"checkpoint_limit: 10", 5 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const (
				topic = "shared"
				group = "g-shared"
				total = 4000
			)
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 4}})
			c.ProduceN(t, topic, total, nil)

			// Until B has joined, A slows down once it made its progress:
			// on a loaded machine B's join takes seconds, in which A at
			// its own pace would consume everything.
			var bJoined atomic.Bool
			a, b := newSink(t), newSink(t)
			slow := func(ctx context.Context, _ service.MessageBatch, _ []offsetKey) error {
				d := tc.delay
				if !bJoined.Load() && a.ackedCount() >= 200 {
					d = 50 * time.Millisecond
				}
				select {
				case <-time.After(d):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			conf := inputConf(c, topic, group, tc.batching)
			a.write, b.write = slow, slow

			sa := startStream(t, a, 1, conf)
			waitFor(t, "member A to make progress", func() bool { return a.ackedCount() >= 200 })
			sb := startStream(t, b, 1, conf)
			// franz-go hands out a fetch one partition after another,
			// so the partitions B gets may be ones A has finished: B's
			// join shows in its log, not necessarily in its acks.
			waitFor(t, "member B to get partitions", func() bool { return sb.logs.count("assigned partitions") > 0 })
			bJoined.Store(true)
			if a.ackedCount() == total {
				t.Fatal("member A consumed everything before B joined; the test proves nothing")
			}

			sa.stop(10 * time.Second)
			waitFor(t, "every record to be acked by A or B", func() bool {
				all := a.ackedSet()
				for k := range b.ackedSet() {
					all[k] = true
				}
				return len(all) == total
			})
			waitFor(t, "commits at the end of every partition", func() bool {
				committed := c.Committed(t, group)[topic]
				for p, end := range c.EndOffsets(t, topic) {
					if committed[p] != end {
						return false
					}
				}
				return true
			})
		})
	}
}

func TestInputBrokerAbsentAtStart(t *testing.T) {
	t.Parallel()
	const topic, group = "late", "g-late"
	port := kafkatest.FreePort(t)
	addr := kafkatest.Addr(port)

	s := newSink(t)
	ts := startStream(t, s, 1, fmt.Sprintf("seed_brokers: [ %q ]\ntopics: [ %q ]\nconsumer_group: %q\ncommit_period: 50ms", addr, topic, group))
	waitFor(t, "the outage to be logged", func() bool { return ts.logs.count("is unreachable") > 0 })

	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}}, kfake.Ports(port))
	c.ProduceN(t, topic, 100, nil)
	waitFor(t, "the records to be consumed", func() bool { return s.ackedCount() == 100 })
	ts.stop(10 * time.Second)

	if n := ts.logs.count("is unreachable"); n != 1 {
		t.Errorf("outage logged %d times, want once", n)
	}
	if n := ts.logs.count("is reachable again"); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
}

func TestInputCheckpointLimitBoundsUnacked(t *testing.T) {
	t.Parallel()
	const (
		topic = "bounded"
		group = "g-bounded"
		limit = 10
		total = 100
	)
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, total, nil)

	// The output holds every record until the test releases it, oldest
	// first, and only when `limit` records are waiting: if the input did
	// not stop at the limit, more would pile up here.
	var (
		mu      sync.Mutex
		waiting = map[int64]chan struct{}{}
	)
	s := newSink(t)
	s.write = func(ctx context.Context, _ service.MessageBatch, offs []offsetKey) error {
		ch := make(chan struct{})
		mu.Lock()
		waiting[offs[0].offset] = ch
		mu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ts := startStream(t, s, 64, inputConf(c, topic, group,
		fmt.Sprintf("checkpoint_limit: %d", limit), "batching:\n  count: 1"))

	for next := int64(0); next < total; next++ {
		waitFor(t, fmt.Sprintf("%d records waiting (releasing offset %d)", min(limit, total-next), next), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return int64(len(waiting)) >= min(limit, total-next)
		})
		mu.Lock()
		close(waiting[next])
		delete(waiting, next)
		mu.Unlock()
	}
	waitFor(t, "all records acked", func() bool { return s.ackedCount() == total })
	ts.stop(10 * time.Second)
	if s.maxFlight != limit {
		t.Fatalf("at most %d records were in the pipeline at once, want exactly checkpoint_limit=%d", s.maxFlight, limit)
	}
}

func TestInputMessages(t *testing.T) {
	t.Parallel()
	const topic, group = "msgs", "g-msgs"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	big := bytes.Repeat([]byte("x"), 16<<20)
	ts := time.UnixMilli(1779330600123)
	c.Produce(t,
		&kgo.Record{Topic: topic, Key: []byte("k1"), Value: []byte(`{"a":1}`), Timestamp: ts, Headers: []kgo.RecordHeader{
			{Key: "trace", Value: []byte("abc")},
			{Key: msgmeta.KafkaTopic, Value: []byte("spoofed")},
		}},
		&kgo.Record{Topic: topic, Key: []byte("k2"), Value: nil, Timestamp: ts},   // tombstone
		&kgo.Record{Topic: topic, Value: []byte{}, Timestamp: ts},                 // empty, no key
		&kgo.Record{Topic: topic, Key: []byte("big"), Value: big, Timestamp: ts},  // 16 MiB
		&kgo.Record{Topic: topic, Value: []byte{0xff, 0x00, 0xfe}, Timestamp: ts}, // not UTF-8
	)

	s := newSink(t)
	s.keepMsgs = true
	stream := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "5 messages", func() bool { return s.ackedCount() == 5 })
	stream.stop(10 * time.Second)

	byOffset := map[int64]*service.Message{}
	for _, m := range s.msgs {
		byOffset[msgOffset(t, m).offset] = m
	}
	meta := func(m *service.Message, k string) (string, bool) { return m.MetaGet(k) }
	body := func(m *service.Message) []byte {
		b, err := m.AsBytes()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	m0 := byOffset[0]
	for k, want := range map[string]string{
		msgmeta.KafkaKey: "k1", msgmeta.KafkaTopic: topic, msgmeta.KafkaPartition: "0", msgmeta.KafkaOffset: "0",
		msgmeta.KafkaTimestampMs: "1779330600123", "trace": "abc",
	} {
		if got, ok := meta(m0, k); !ok || got != want {
			t.Errorf("metadata %s = %q (present %v), want %q", k, got, ok, want)
		}
	}
	if string(body(m0)) != `{"a":1}` {
		t.Errorf("body = %q", body(m0))
	}
	if len(body(byOffset[1])) != 0 {
		t.Errorf("tombstone body = %q, want empty", body(byOffset[1]))
	}
	if k, _ := meta(byOffset[1], msgmeta.KafkaKey); k != "k2" {
		t.Errorf("tombstone key = %q, want k2", k)
	}
	if len(body(byOffset[2])) != 0 {
		t.Errorf("empty value body = %q, want empty", body(byOffset[2]))
	}
	if _, ok := meta(byOffset[2], msgmeta.KafkaKey); ok {
		t.Error("kafka_key is set for a record without a key")
	}
	if !bytes.Equal(body(byOffset[3]), big) {
		t.Errorf("16 MiB body has %d bytes", len(body(byOffset[3])))
	}
	if !bytes.Equal(body(byOffset[4]), []byte{0xff, 0x00, 0xfe}) {
		t.Errorf("binary body = %v", body(byOffset[4]))
	}
}

// TestInputFetchMinimum: fetch_min_bytes and fetch_max_wait reach the
// broker in every fetch, and a record below the minimum is still
// delivered once the wait ends.
func TestInputFetchMinimum(t *testing.T) {
	t.Parallel()
	const topic, group = "fetchmin", "g-fetchmin"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	var mu sync.Mutex
	type asked struct{ minBytes, maxWaitMs int32 }
	seen := map[asked]int{}
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		mu.Lock()
		seen[asked{req.MinBytes, req.MaxWaitMillis}]++
		mu.Unlock()
		return nil, nil, false // the broker answers as usual
	})
	c.Produce(t, &kgo.Record{Topic: topic, Value: []byte("one small record")})

	s := newSink(t)
	stream := startStream(t, s, 1, inputConf(c, topic, group, "fetch_min_bytes: 1MiB", "fetch_max_wait: 200ms"))
	waitFor(t, "the record", func() bool { return s.ackedCount() == 1 })
	stream.stop(10 * time.Second)

	mu.Lock()
	defer mu.Unlock()
	// (Fetches of other clients, such as a one-off {1 1}, may show too.)
	if want, defaults := (asked{1 << 20, 200}), (asked{1, 5000}); seen[want] == 0 || seen[defaults] > 0 {
		t.Fatalf("fetches asked for (min bytes, max wait ms) %v, want %v and never the defaults %v", seen, want, defaults)
	}
}

func TestInputCloseLeavesGroup(t *testing.T) {
	t.Parallel()
	const topic, group = "leave", "g-leave"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}})
	c.ProduceN(t, topic, 10, nil)

	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "10 records", func() bool { return s.ackedCount() == 10 })
	members := func() int {
		d, err := c.Admin(t).DescribeGroups(context.Background(), group)
		if err != nil {
			t.Fatal(err)
		}
		return len(d[group].Members)
	}
	if n := members(); n != 1 {
		t.Fatalf("group has %d members while consuming, want 1", n)
	}
	ts.stop(10 * time.Second)
	// Leaving is synchronous in Close: no wait for a session timeout.
	if n := members(); n != 0 {
		t.Fatalf("group has %d members after a clean stop, want 0", n)
	}
	if got := c.Committed(t, group)[topic]; got[0]+got[1] != 10 {
		t.Fatalf("committed %v, want 10 records in total", got)
	}
}

// TestInputEarlyExitLeavesGroup: a process that ends while it starts
// (SIGTERM before the stream runs; internal/launch) closes its input through
// the launch gate: the acknowledged offsets are committed and the group is
// left at once, so its partitions move on without waiting for
// session_timeout, and the input does not join again.
func TestInputEarlyExitLeavesGroup(t *testing.T) {
	t.Parallel()
	const topic, group = "early-exit", "g-early-exit"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 5, nil)

	f := newInput(t, inputConf(c, topic, group, "session_timeout: 60s", "heartbeat_interval: 1s"), nil)
	gate := launch.NewGate()
	gate.Hold()
	f.started = gate
	ctx := context.Background()
	if err := f.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close(ctx) })
	for _, ack := range readN(t, f, 5) {
		if err := ack(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	members := func() int {
		d, err := c.Admin(t).DescribeGroups(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		return len(d[group].Members)
	}
	if n := members(); n != 1 {
		t.Fatalf("group has %d members while consuming, want 1", n)
	}

	if !gate.Cancel() {
		t.Fatal("the held gate was already open")
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gate.Abandon(actx)
	if n := members(); n != 0 {
		t.Fatalf("group has %d members after the early exit, want 0 (left, not expired after 60s)", n)
	}
	if got := c.Committed(t, group)[topic][0]; got != 5 {
		t.Errorf("committed offset %d after the early exit, want the 5 acknowledged records", got)
	}
	if err := f.Connect(ctx); !errors.Is(err, errExiting) {
		t.Fatalf("Connect after the early exit: %v, want %v", err, errExiting)
	}
	if n := members(); n != 0 {
		t.Fatalf("group has %d members after a refused Connect, want 0", n)
	}
}

// TestInputConnectRefusedOnceExitingBeforeStart: once the process is
// exiting before it started, Connect refuses at once, reaching for no
// broker and making no client. It used to make one and join the group
// before it looked, then close it again; when the engine asked while
// Abandon's close of the previous client was still waiting for its loops,
// the two shared the loops' WaitGroup and the process panicked with a
// member left in the group (seen in the e2e TestSigtermWhileStarting).
func TestInputConnectRefusedOnceExitingBeforeStart(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := ln.Addr().String() // closed below: nothing answers there
	ln.Close()
	f := newInput(t, fmt.Sprintf("seed_brokers: [ %q ]\ntopics: [ t ]\nconsumer_group: g\n", nobody), nil)
	gate := launch.NewGate()
	gate.Hold()
	f.started = gate
	if !gate.Cancel() {
		t.Fatal("the held gate was already open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Connect(ctx); !errors.Is(err, errExiting) {
		t.Fatalf("Connect while exiting before start: %v, want %v at once", err, errExiting)
	}
	if f.connected() {
		t.Fatal("Connect while exiting before start made a client")
	}
}

func TestInputConfigErrors(t *testing.T) {
	t.Parallel()
	base := "seed_brokers: [ a:1 ]\ntopics: [ t ]\n"
	for name, tc := range map[string]struct{ yaml, want string }{
		"EmptyGroup":               {base + "consumer_group: ' '", "consumer_group"},
		"NoTopics":                 {"seed_brokers: [ a:1 ]\ntopics: [ ',' ]\nconsumer_group: g", "topics"},
		"ZeroLimit":                {base + "consumer_group: g\ncheckpoint_limit: 0", "checkpoint_limit"},
		"HeartbeatTooSlow":         {base + "consumer_group: g\nsession_timeout: 6s\nheartbeat_interval: 6s", "heartbeat_interval"},
		"BadFetchSize":             {base + "consumer_group: g\nfetch_max_bytes: 5GiB", "fetch_max_bytes"},
		"FetchAboveWhatFranzReads": {base + "consumer_group: g\nfetch_max_bytes: 1073741825B", `fetch_max_bytes: "1073741825B" must be between 1B and 1GiB`},
		"PartitionFetchAboveIt":    {base + "consumer_group: g\nfetch_max_partition_bytes: 2GiB", `fetch_max_partition_bytes: "2GiB" must be between 1B and 1GiB`},
		"ZeroFetchMinimum":         {base + "consumer_group: g\nfetch_min_bytes: 0B", "fetch_min_bytes"},
		"FetchWaitTooShort":        {base + "consumer_group: g\nfetch_max_wait: 5ms", "fetch_max_wait"},
		"FetchWaitTooLong":         {base + "consumer_group: g\nfetch_max_wait: 1000h", "fetch_max_wait: 1000h0m0s is above 596h31m23.647s"},
		"ZeroCommitPeriod":         {base + "consumer_group: g\ncommit_period: 0s", "commit_period"},
		"BadBatchProcessor":        {base + "consumer_group: g\nbatching:\n  count: 2\n  processors:\n    - bloblang: 'root = ('", "batching"},
		"ZeroBufferedBytes":        {base + "consumer_group: g\nmax_buffered_bytes: 0B", "max_buffered_bytes"},
		"BadBufferedBytes":         {base + "consumer_group: g\nmax_buffered_bytes: lots", "max_buffered_bytes"},
		"NoReplayOfNacks":          {base + "consumer_group: g\nauto_replay_nacks: false", "auto_replay_nacks"},
		"SessionTooShort":          {base + "consumer_group: g\nsession_timeout: 99ms\nheartbeat_interval: 10ms", "session_timeout: 99ms is not from 100ms to 596h31m23.647s"},
		"RebalanceTooLong":         {base + "consumer_group: g\nrebalance_timeout: 597h", "rebalance_timeout: 597h0m0s is not from 100ms to 596h31m23.647s"},
		"MetadataTooYoung":         {base + "consumer_group: g\nmetadata_max_age: 4s", "metadata_max_age: 4s is not from 5s to 1h0m0s"},
		"MetadataTooOld":           {base + "consumer_group: g\nmetadata_max_age: 61m", "metadata_max_age: 1h1m0s is not from 5s to 1h0m0s"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conf, err := franzInputSpec().ParseYAML(tc.yaml, nil)
			if err == nil {
				_, err = newFranzInputFromParsed(conf, service.MockResources())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestInputAtTheLargestLimits: the largest checkpoint_limit, byte budget,
// fetch sizes and batch count the input accepts consume as the defaults
// do. A checkpoint_limit of the largest int sized a batch by it, and the
// process panicked (makeslice: cap out of range) at the first record.
func TestInputAtTheLargestLimits(t *testing.T) {
	t.Parallel()
	const most = "checkpoint_limit: 9223372036854775807\nmax_buffered_bytes: 4EiB\nfetch_max_bytes: 1GiB\nfetch_max_partition_bytes: 1GiB"
	for name, extra := range map[string]string{
		"NoPolicy":     most,
		"Period":       most + "\nbatching:\n  period: 10ms",
		"LargestCount": most + "\nbatching:\n  count: 9223372036854775807\n  period: 10ms",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			topic, group := "most-"+strings.ToLower(name), "g-most-"+strings.ToLower(name)
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}})
			c.ProduceN(t, topic, 20, nil)
			s := newSink(t)
			startStream(t, s, 1, inputConf(c, topic, group, extra))
			waitFor(t, "the 20 records", func() bool { return s.ackedCount() == 20 })
		})
	}
}

// TestInputClientAtTheBounds: the smallest and largest fetch sizes and
// group timeouts the input accepts make a client franz-go accepts too. franz-go checks its
// settings only when the client is created, in Connect, where a refusal
// was retried forever and nothing was consumed (fetch_max_bytes 2GiB).
func TestInputClientAtTheBounds(t *testing.T) {
	t.Parallel()
	base := "seed_brokers: [ 127.0.0.1:1 ]\ntopics: [ t ]\nconsumer_group: g\n"
	bounds := map[string]string{
		"ShortestGroupTimeouts": "session_timeout: 100ms\nheartbeat_interval: 50ms\nrebalance_timeout: 100ms",
		"LongestGroupTimeouts":  "session_timeout: 596h31m23.647s\nrebalance_timeout: 596h31m23.647s\nfetch_max_wait: 596h31m23.647s",
	}
	for _, size := range []string{"1B", "16MiB", "1GiB"} {
		bounds["FetchSizes"+size] = "fetch_max_bytes: " + size + "\nfetch_max_partition_bytes: " + size + "\nfetch_min_bytes: " + size
	}
	for name, extra := range bounds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conf, err := franzInputSpec().ParseYAML(base+extra, nil)
			if err != nil {
				t.Fatal(err)
			}
			f, err := newFranzInputFromParsed(conf, service.MockResources())
			if err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(f.clientOpts...)
			if err != nil {
				t.Fatalf("franz-go refuses the client of %s: %v", extra, err)
			}
			cl.Close()
		})
	}
}

func TestInputStaticMemberRestart(t *testing.T) {
	t.Parallel()
	const topic, group = "static", "g-static"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}})
	c.ProduceN(t, topic, 10, nil)
	// A long session: if the restarted member were not recognised, its
	// partitions would stay with the stopped one for a minute.
	conf := inputConf(c, topic, group, "instance_id: forwarder-0", "session_timeout: 60s", "heartbeat_interval: 3s")

	first := newSink(t)
	s1 := startStream(t, first, 1, conf)
	waitFor(t, "10 records", func() bool { return first.ackedCount() == 10 })
	s1.stop(10 * time.Second)

	d, err := c.Admin(t).DescribeGroups(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d[group].Members); n != 1 {
		t.Fatalf("a stopped static member should stay in the group until its session ends; group has %d members", n)
	}
	if got := c.Committed(t, group)[topic]; got[0]+got[1] != 10 {
		t.Fatalf("committed %v before the restart, want 10 records in total", got)
	}

	c.ProduceN(t, topic, 10, func(i int) *kgo.Record { return &kgo.Record{Value: fmt.Appendf(nil, "late-%d", i)} })
	second := newSink(t)
	s2 := startStream(t, second, 1, conf)
	waitFor(t, "the restarted member to consume the new records", func() bool { return second.ackedCount() == 10 })
	s2.stop(10 * time.Second)
	for k := range second.ackedSet() {
		if first.isAcked(k) {
			t.Errorf("record %v consumed again after a clean restart", k)
		}
	}
}

func TestInputBrokerOutageLater(t *testing.T) {
	t.Parallel()
	const topic, group = "outage", "g-outage"
	port, dir := kafkatest.FreePort(t), t.TempDir()
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}}, kfake.Ports(port), kfake.DataDir(dir))
	c.ProduceN(t, topic, 10, nil)

	s := newSink(t)
	ts := startStream(t, s, 1, inputConf(c, topic, group))
	waitFor(t, "10 records", func() bool { return s.ackedCount() == 10 })
	waitFor(t, "commit at 10", func() bool { return c.Committed(t, group)[topic][0] == 10 })

	c.Close()
	waitFor(t, "the outage to be logged", func() bool { return ts.logs.count("is unreachable") > 0 })
	// Same port, same data: the broker comes back.
	c = kafkatest.New(t, nil, kfake.Ports(port), kfake.DataDir(dir))
	c.ProduceN(t, topic, 10, nil)
	waitFor(t, "the records produced after the outage", func() bool { return s.ackedCount() == 20 })
	ts.stop(10 * time.Second)

	if n := ts.logs.count("is unreachable"); n != 1 {
		t.Errorf("outage logged %d times, want once", n)
	}
	if n := ts.logs.count("is reachable again"); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
}

// TestOutageLoggerIgnoresCancelledDials: a dial that our own stop cancels
// (the input closing while franz-go dials) neither starts nor ends an
// outage. Before, a stop right after a recovery logged a second outage and a
// second recovery (TestInputBrokerOutageLater, once in CI).
func TestOutageLoggerIgnoresCancelledDials(t *testing.T) {
	logs := &logBuffer{}
	o := newOutageLogger(service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	meta := kgo.BrokerMetadata{Host: "127.0.0.1", Port: 9092}
	cancelled := fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: context.Canceled})
	refused := fmt.Errorf("unable to dial: %w", errors.New("connect: connection refused"))

	o.OnBrokerConnect(meta, 0, nil, cancelled)
	if o.anyDown() || logs.count("is unreachable") != 0 {
		t.Fatalf("a cancelled dial started an outage:\n%s", logs.String())
	}
	o.OnBrokerConnect(meta, 0, nil, refused)
	o.OnBrokerConnect(meta, 0, nil, cancelled)
	if !o.anyDown() {
		t.Fatal("a cancelled dial ended an outage")
	}
	o.OnBrokerConnect(meta, 0, nil, nil)
	o.OnBrokerConnect(meta, 0, nil, kgo.ErrClientClosed)
	if o.anyDown() {
		t.Fatal("a dial cut by closing the client started an outage")
	}
	if u, r := logs.count("is unreachable"), logs.count("is reachable again"); u != 1 || r != 1 {
		t.Fatalf("outage logged %d times, recovery %d times; want once each:\n%s", u, r, logs.String())
	}
}

// TestInputReadsAPartitionAddedToItsTopic: a partition added to a topic
// while the group reads it is read within metadata_max_age (its minimum,
// 5s, here): with franz-go's 5-minute default its records would wait that
// long.
func TestInputReadsAPartitionAddedToItsTopic(t *testing.T) {
	t.Parallel()
	const topic, group = "grown", "g-grown"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 2, nil)
	s := newSink(t)
	startStream(t, s, 1, inputConf(c, topic, group, "metadata_max_age: 5s"))
	waitFor(t, "offsets 0 and 1", func() bool { return s.ackedCount() == 2 })

	ctx := context.Background()
	if _, err := c.Admin(t).CreatePartitions(ctx, 1, topic); err != nil {
		t.Fatal(err)
	}
	producer := c.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("p1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// waitFor gives up after a minute, well before five.
	waitFor(t, "the added partition's first record", func() bool { return s.isAcked(offsetKey{topic, 1, 0}) })
}

// TestInputSaysWhyItCannotJoin: a broker that refuses the group's session
// timeout (above its group.max.session.timeout.ms) leaves the input with
// nothing to read; one warning names the group and the broker's reason,
// however often franz-go tries again.
func TestInputSaysWhyItCannotJoin(t *testing.T) {
	t.Parallel()
	const topic, group = "refused", "g-refused"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}},
		kfake.BrokerConfigs(map[string]string{"group.max.session.timeout.ms": "5000"}))
	ts := startStream(t, newSink(t), 1, inputConf(c, topic, group, "session_timeout: 10s"))
	const want = `kafka_franz: group \"g-refused\": unable to join group session: INVALID_SESSION_TIMEOUT`
	// franz-go retries the join with backoff; the repeats go to DEBUG.
	waitFor(t, "the warning and two repeats", func() bool { return ts.logs.count(want) == 3 })
	if n := ts.logs.count("level=WARN"); n != 1 {
		t.Errorf("want the one warning, got %d:\n%s", n, ts.logs.String())
	}
}
