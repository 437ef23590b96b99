package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// fakeKafka is a batch input that behaves like a partition of a Kafka topic
// for the properties under test: messages carry kafka_* metadata and a
// messageId derived from their offset, the test releases them in steps, and
// every ack is recorded with its offsets, the way kafka_franz would commit
// them. (The real kafka_franz input lives in a sibling plugin, which this
// package must not import.)
type fakeKafka struct {
	topic     string
	batchSize int
	// body makes the payload at an offset; nil: a vehicle event whose
	// messageId is messageIDAt(offset).
	body func(offset int64) []byte
	// onAck runs for every ack before it is recorded (a nil error is the
	// moment the offset would be committed).
	onAck func(offsets []int64, err error)

	mu       sync.Mutex
	released int64 // offsets below this may be read
	next     int64
	finished bool
	wake     chan struct{}
	acks     []ackRecord
}

type ackRecord struct {
	offsets []int64
	err     error
}

func newFakeKafka(topic string, batchSize int) *fakeKafka {
	return &fakeKafka{topic: topic, batchSize: batchSize, wake: make(chan struct{}, 1)}
}

func messageIDAt(offset int64) string { return fmt.Sprintf("msg-%06d", offset) }

// release makes n more messages readable.
func (f *fakeKafka) release(n int) {
	f.mu.Lock()
	f.released += int64(n)
	f.mu.Unlock()
	f.poke()
}

// finish ends the input once every released message has been read.
func (f *fakeKafka) finish() {
	f.mu.Lock()
	f.finished = true
	f.mu.Unlock()
	f.poke()
}

func (f *fakeKafka) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fakeKafka) Connect(context.Context) error { return nil }

func (f *fakeKafka) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	for {
		f.mu.Lock()
		if f.next < f.released {
			n := min(int64(f.batchSize), f.released-f.next)
			batch := make(service.MessageBatch, n)
			offsets := make([]int64, n)
			for i := range batch {
				off := f.next + int64(i)
				offsets[i] = off
				body := vehicle(messageIDAt(off))
				if f.body != nil {
					body = f.body(off)
				}
				m := service.NewMessage(body)
				m.MetaSetMut(msgmeta.KafkaTopic, f.topic)
				m.MetaSetMut(msgmeta.KafkaPartition, int32(0))
				m.MetaSetMut(msgmeta.KafkaOffset, off)
				m.MetaSetMut(msgmeta.KafkaKey, "CAM-0001")
				batch[i] = m
			}
			f.next += n
			f.mu.Unlock()
			return batch, func(_ context.Context, err error) error {
				if f.onAck != nil {
					f.onAck(offsets, err)
				}
				f.mu.Lock()
				f.acks = append(f.acks, ackRecord{offsets: offsets, err: err})
				f.mu.Unlock()
				return nil
			}, nil
		}
		done := f.finished
		f.mu.Unlock()
		if done {
			return nil, nil, service.ErrEndOfInput
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

func (f *fakeKafka) Close(context.Context) error { return nil }

// committed returns the offsets acked without error, with how often.
func (f *fakeKafka) committed() map[int64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]int{}
	for _, a := range f.acks {
		if a.err == nil {
			for _, o := range a.offsets {
				out[o]++
			}
		}
	}
	return out
}

func (f *fakeKafka) nacks() []ackRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ackRecord
	for _, a := range f.acks {
		if a.err != nil {
			out = append(out, a)
		}
	}
	return out
}

// counters is a metrics exporter that sums counters by name and labels.
type counters struct {
	mu sync.Mutex
	v  map[string]int64
}

type counterFn func(int64)

func (c counterFn) Incr(n int64) { c(n) }

type noopMetric struct{}

func (noopMetric) Timing(int64) {}
func (noopMetric) Set(int64)    {}

func (c *counters) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	return func(labelValues ...string) service.MetricsExporterCounter {
		id := name
		for i, k := range labelKeys {
			if k != "label" && k != "path" { // added by Benthos to every plugin metric
				id += fmt.Sprintf(",%s=%s", k, labelValues[i])
			}
		}
		return counterFn(func(n int64) {
			c.mu.Lock()
			c.v[id] += n
			c.mu.Unlock()
		})
	}
}

func (c *counters) NewTimerCtor(string, ...string) service.MetricsExporterTimerCtor {
	return func(...string) service.MetricsExporterTimer { return noopMetric{} }
}

func (c *counters) NewGaugeCtor(string, ...string) service.MetricsExporterGaugeCtor {
	return func(...string) service.MetricsExporterGauge { return noopMetric{} }
}

func (c *counters) Close(context.Context) error { return nil }

func (c *counters) get(id string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v[id]
}

// streamBundle is a real Benthos stream: fakeKafka → outbox → drop.
type streamBundle struct {
	in      *fakeKafka
	logs    *logRecorder
	metrics *counters
	stream  *service.Stream
	done    chan error
}

func startStream(t *testing.T, dsn string, in *fakeKafka, threads int) *streamBundle {
	t.Helper()
	b := &streamBundle{in: in, logs: &logRecorder{}, metrics: &counters{v: map[string]int64{}}, done: make(chan error, 1)}
	env := service.GlobalEnvironment().Clone()
	if err := env.RegisterBatchInput("fake_kafka", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Resources) (service.BatchInput, error) { return in, nil }); err != nil {
		t.Fatal(err)
	}
	if err := env.RegisterMetricsExporter("counters", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Logger) (service.MetricsExporter, error) { return b.metrics, nil }); err != nil {
		t.Fatal(err)
	}
	sb := env.NewStreamBuilder()
	sb.SetLogger(slog.New(b.logs))
	err := sb.SetYAML(fmt.Sprintf(`
input:
  fake_kafka: {}
pipeline:
  threads: %d
  processors:
    - outbox:
        dsn: %q
        api_types:
          %s: VEHICLE_EVENT
output:
  drop: {}
metrics:
  counters: {}
`, threads, dsn, in.topic))
	if err != nil {
		t.Fatal(err)
	}
	if b.stream, err = sb.Build(); err != nil {
		t.Fatal(err)
	}
	go func() { b.done <- b.stream.Run(context.Background()) }()
	t.Cleanup(func() { _ = b.stream.StopWithin(10 * time.Second) })
	return b
}

// TestStreamPostgresStoppedMidStream stops PostgreSQL while messages keep
// arriving, then starts it again. No offset may be committed for a message
// without a committed row, nothing may be nacked (the processor waits
// instead), and afterwards every message has exactly one row.
func TestStreamPostgresStoppedMidStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := pgtest.StartCluster(t)
	dsn := pgtest.NewDBOn(t, cluster)
	checker, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(checker.Close)

	const batch, perPhase = 10, 100
	in := newFakeKafka(topicVehicle, batch)

	// While the database is up, every commit is checked against it at the
	// moment it happens. While it is down nothing can be checked, so those
	// commits are kept and checked against the rows' commit times afterwards.
	var (
		mu         sync.Mutex
		down       bool
		downAcks   []int64
		violations []string
	)
	in.onAck = func(offsets []int64, err error) {
		if err != nil {
			return
		}
		mu.Lock()
		isDown := down
		mu.Unlock()
		if isDown {
			mu.Lock()
			downAcks = append(downAcks, offsets...)
			mu.Unlock()
			return
		}
		keys := make([]string, len(offsets))
		for i, o := range offsets {
			keys[i] = messageIDAt(o)
		}
		var n int
		qerr := checker.QueryRow(ctx, "SELECT count(*) FROM forward_records WHERE message_key = ANY($1)", keys).Scan(&n)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case qerr != nil:
			violations = append(violations, fmt.Sprintf("offsets %v: could not check rows: %v", offsets, qerr))
		case n != len(offsets):
			violations = append(violations, fmt.Sprintf("offsets %v committed with only %d of %d rows stored", offsets, n, len(offsets)))
		}
	}

	s := startStream(t, dsn, in, 2)
	allCommitted := func(n int) func() bool {
		return func() bool { return len(in.committed()) == n }
	}

	// Phase 1: database up.
	in.release(perPhase)
	waitFor(t, "phase 1 commits", allCommitted(perPhase))

	// Phase 2: database stopped, messages keep coming.
	var stoppedAt time.Time
	if err := checker.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&stoppedAt); err != nil {
		t.Fatal(err)
	}
	checker.Reset() // its connections die with the server
	if err := cluster.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	down = true
	mu.Unlock()
	in.release(perPhase)
	// Let the processor fail and retry a few times with the batches held.
	waitFor(t, "the outage to be logged", func() bool { return s.logs.count(slog.LevelError, "Cannot persist to database") == 1 })
	waitFor(t, "retries during the outage", func() bool { return s.logs.count(slog.LevelDebug, "Still cannot persist") >= 3 })
	for o := range in.committed() {
		if o >= perPhase {
			t.Fatalf("offset %d committed while PostgreSQL was down and before its row could be written", o)
		}
	}

	// Phase 3: database back.
	mu.Lock()
	down = false
	mu.Unlock()
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "phase 2 commits after the restart", allCommitted(2*perPhase))
	in.release(perPhase)
	waitFor(t, "phase 3 commits", allCommitted(3*perPhase))
	in.finish()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("stream ended with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stream did not end after the input finished")
	}

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	if nacks := in.nacks(); len(nacks) != 0 {
		t.Errorf("%d batches nacked (first: %v); the processor must wait for the database instead", len(nacks), nacks[0].err)
	}
	for o, n := range in.committed() {
		if n != 1 {
			t.Errorf("offset %d committed %d times", o, n)
		}
	}
	rows := readRows(t, checker)
	if len(rows) != 3*perPhase {
		t.Errorf("%d rows, want %d", len(rows), 3*perPhase)
	}
	for o := range int64(3 * perPhase) {
		if r, ok := rows[messageIDAt(o)]; !ok || r.KafkaOffset != o || r.Status != string(outboxdb.StatusPending) {
			t.Errorf("offset %d: row %+v (found %v)", o, r, ok)
		}
	}
	// Commits seen while the server was down must be of rows committed before it stopped.
	if len(downAcks) > 0 {
		keys := make([]string, len(downAcks))
		for i, o := range downAcks {
			keys[i] = messageIDAt(o)
		}
		var late int
		if err := checker.QueryRow(ctx, "SELECT count(*) FROM forward_records WHERE message_key = ANY($1) AND created_at >= $2", keys, stoppedAt).Scan(&late); err != nil {
			t.Fatal(err)
		}
		if late != 0 {
			t.Errorf("%d offsets committed during the outage belong to rows written after it", late)
		}
	}
	if n := s.logs.count(slog.LevelError, ""); n != 1 {
		t.Errorf("%d error lines for one outage, want 1:\n%s", n, s.logs.all())
	}
	if n := s.logs.count(slog.LevelInfo, "is back after"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, s.logs.all())
	}
	if got := s.metrics.get("forwarder_rows_persisted_total,status=PENDING"); got != 3*perPhase {
		t.Errorf("forwarder_rows_persisted_total{status=PENDING} = %d, want %d", got, 3*perPhase)
	}
}

// TestStreamStoppedWhileDatabaseDown stops the stream while the processor
// waits for PostgreSQL: the held batch must not be committed.
func TestStreamStoppedWhileDatabaseDown(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	dsn := pgtest.NewDBOn(t, cluster)
	in := newFakeKafka(topicVehicle, 5)
	s := startStream(t, dsn, in, 1)
	in.release(5)
	waitFor(t, "the first batch", func() bool { return len(in.committed()) == 5 })

	if err := cluster.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	in.release(5)
	waitFor(t, "the outage to be logged", func() bool { return s.logs.count(slog.LevelError, "Cannot persist") == 1 })
	// The engine waits for the held batch up to the timeout, then cancels it.
	_ = s.stream.StopWithin(time.Second)
	if err := <-s.done; err != nil && !strings.Contains(err.Error(), "context") {
		t.Logf("stream ended with %v", err)
	}
	got := slices.Sorted(maps.Keys(in.committed()))
	if len(got) != 5 || got[4] != 4 {
		t.Fatalf("committed offsets %v, want only 0-4 (the batch held during the outage must not be committed)", got)
	}
	if n := s.logs.count(slog.LevelError, "context canceled"); n != 0 {
		t.Errorf("the cancellation was logged as an error:\n%s", s.logs.all())
	}
}

// TestStreamCountsKeyConflicts: every odd record reuses the key of the
// record before it with another payload (in the same batch or the next);
// each is skipped as a duplicate, counted in forwarder_key_conflicts_total
// and logged with its Kafka coordinates, and the batches are acknowledged.
func TestStreamCountsKeyConflicts(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	in := newFakeKafka(topicVehicle, 3)
	in.body = func(offset int64) []byte {
		if offset%2 == 1 {
			return []byte(`{"messageId":"` + messageIDAt(offset-1) + `","deviceId":"CAM-0009"}`)
		}
		return vehicle(messageIDAt(offset))
	}
	s := startStream(t, dsn, in, 1)
	in.release(12)
	waitFor(t, "all commits", func() bool { return len(in.committed()) == 12 })
	for name, want := range map[string]int64{
		"forwarder_key_conflicts_total":                 6,
		"forwarder_rows_persisted_total,status=PENDING": 6,
	} {
		if got := s.metrics.get(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if n := s.logs.count(slog.LevelWarn, "device-vehicle-event[0]@1 not stored"); n != 1 {
		t.Errorf("the first conflict was logged %d times, want once:\n%s", n, s.logs.all())
	}
}

// TestStreamCountsMissingMessageIDs checks the metrics through a real
// stream's metrics exporter.
func TestStreamCountsMissingMessageIDs(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	in := newFakeKafka(topicVehicle, 10)
	in.body = func(offset int64) []byte {
		switch {
		case offset == 3:
			return []byte(`[1,2,3]`)
		case offset%2 == 1:
			return []byte(`{"deviceId":"CAM-0001"}`)
		default:
			return vehicle(messageIDAt(offset))
		}
	}
	s := startStream(t, dsn, in, 1)
	in.release(20)
	waitFor(t, "all commits", func() bool { return len(in.committed()) == 20 })
	for name, want := range map[string]int64{
		"forwarder_missing_message_id_total":            9, // odd offsets but the array
		"forwarder_rows_persisted_total,status=PENDING": 19,
		"forwarder_rows_persisted_total,status=FAILED":  1,
	} {
		if got := s.metrics.get(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if n := s.logs.count(slog.LevelWarn, "fallback key"); n != 9 {
		t.Errorf("%d warnings, want 9", n)
	}
}

// TestStreamKeysReusedCoordinatesApart: messages without a messageId are
// keyed by their Kafka coordinates. When the topic is deleted and created
// again its offsets start over, and the new topic's messages meet the old
// topic's rows under the same coordinates with other payloads. They are
// stored under keys of their own (coordinates~hash) and sent, not skipped
// as key conflicts; a redelivery of either is still recognized, and so is a
// replay of the new topic once retention has retired the old one's rows.
func TestStreamKeysReusedCoordinatesApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	withoutID := func(device string) func(int64) []byte {
		return func(offset int64) []byte {
			return []byte(fmt.Sprintf(`{"deviceId":%q,"inoutType":1,"seq":%d}`, device, offset))
		}
	}
	run := func(body func(int64) []byte, n int) *streamBundle {
		t.Helper()
		in := newFakeKafka(topicVehicle, 3)
		in.body = body
		s := startStream(t, dsn, in, 1)
		in.release(n)
		waitFor(t, "all commits", func() bool { return len(in.committed()) == n })
		if err := s.stream.StopWithin(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		return s
	}
	run(withoutID("CAM-OLD"), 4)
	// The topic created again: offsets 0 to 5, two more than before.
	s := run(withoutID("CAM-NEW"), 6)
	if got := s.metrics.get("forwarder_key_conflicts_total"); got != 0 {
		t.Errorf("forwarder_key_conflicts_total = %d, want 0: the new topic's messages are not other messages reusing a key", got)
	}
	if got := s.metrics.get("forwarder_rows_persisted_total,status=PENDING"); got != 6 {
		t.Errorf("the new topic's run persisted %d rows, want 6", got)
	}
	if n := s.logs.count(slog.LevelWarn, "its Kafka coordinates were an earlier message's"); n < 1 {
		t.Errorf("no warning that coordinates were reused:\n%s", s.logs.all())
	}
	// Redeliveries of both topics' messages add nothing.
	run(withoutID("CAM-NEW"), 6)
	run(withoutID("CAM-OLD"), 4)

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, "SELECT message_key, convert_from(payload, 'UTF8') FROM forward_messages ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Key, Payload string }])
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 10 {
		t.Fatalf("%d rows, want 10 (4 of the old topic, 6 of the new):\n%v", len(stored), stored)
	}
	for i, r := range stored {
		coords := fmt.Sprintf("%s-0-%d", topicVehicle, i)
		if i >= 4 {
			coords = fmt.Sprintf("%s-0-%d", topicVehicle, i-4)
		}
		want := coords
		if i >= 4 && i-4 < 4 {
			sum := sha256.Sum256([]byte(r.Payload))
			want = coords + "~" + hex.EncodeToString(sum[:8])
		}
		if r.Key != want {
			t.Errorf("row %d (%s) has key %q, want %q", i, r.Payload, r.Key, want)
		}
	}
	// Retention retires the old topic's rows (finished: a FAILED row's
	// delivery row goes with it); a replay of the new topic finds its
	// messages under the keys they were given.
	if _, err := pool.Exec(ctx, `WITH old AS (
		DELETE FROM forward_messages WHERE convert_from(payload, 'UTF8') LIKE '%CAM-OLD%' RETURNING id)
		DELETE FROM forward_deliveries WHERE id IN (SELECT id FROM old)`); err != nil {
		t.Fatal(err)
	}
	run(withoutID("CAM-NEW"), 6)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM forward_messages").Scan(&n); err != nil || n != 6 {
		t.Errorf("after the replay: %d rows (%v), want the new topic's 6", n, err)
	}
}
