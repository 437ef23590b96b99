package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Benthos starts these once per process and never stops them.
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/redpanda-data/benthos/v4/internal/component/metrics.(*LocalStat).loop"),
	)
}

// waitTimeout bounds every wait in these tests: far above what a correct
// implementation needs on a loaded machine, so a failure means a bug.
const waitTimeout = 60 * time.Second

// waitFor polls cond until it is true, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// offsetKey identifies one record.
type offsetKey struct {
	topic     string
	partition int32
	offset    int64
}

func (k offsetKey) String() string { return fmt.Sprintf("%s/%d@%d", k.topic, k.partition, k.offset) }

func msgOffset(t testing.TB, m *service.Message) offsetKey {
	t.Helper()
	topic, _ := m.MetaGet(msgmeta.KafkaTopic)
	ps, _ := m.MetaGet(msgmeta.KafkaPartition)
	os, _ := m.MetaGet(msgmeta.KafkaOffset)
	p, err := strconv.ParseInt(ps, 10, 32)
	if err != nil {
		t.Errorf("bad %s %q", msgmeta.KafkaPartition, ps)
	}
	o, err := strconv.ParseInt(os, 10, 64)
	if err != nil {
		t.Errorf("bad %s %q", msgmeta.KafkaOffset, os)
	}
	return offsetKey{topic, int32(p), o}
}

// sink is a test output that records what it is given. Its write hook
// decides, per batch, whether the batch succeeds (nil), fails, or waits.
// A record counts as acked once WriteBatch returned nil for it: recorded
// before returning, so the input can never have seen an ack that is not
// in acked.
type sink struct {
	t     testing.TB
	write func(ctx context.Context, batch service.MessageBatch, offsets []offsetKey) error

	mu        sync.Mutex
	delivered map[offsetKey]int
	acked     map[offsetKey]int
	msgs      []*service.Message
	inFlight  int
	maxFlight int
	keepMsgs  bool
}

func newSink(t testing.TB) *sink {
	return &sink{t: t, delivered: map[offsetKey]int{}, acked: map[offsetKey]int{}}
}

func (s *sink) Connect(context.Context) error { return nil }
func (s *sink) Close(context.Context) error   { return nil }

func (s *sink) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	offsets := make([]offsetKey, len(batch))
	s.mu.Lock()
	for i, m := range batch {
		offsets[i] = msgOffset(s.t, m)
		s.delivered[offsets[i]]++
		if s.keepMsgs {
			s.msgs = append(s.msgs, m.Copy())
		}
	}
	s.inFlight += len(batch)
	s.maxFlight = max(s.maxFlight, s.inFlight)
	s.mu.Unlock()

	var err error
	if s.write != nil {
		err = s.write(ctx, batch, offsets)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight -= len(batch)
	if err == nil {
		for _, o := range offsets {
			s.acked[o]++
		}
	}
	return err
}

func (s *sink) ackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

func (s *sink) isAcked(k offsetKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked[k] > 0
}

func (s *sink) deliveries(k offsetKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered[k]
}

// ackedSet returns a copy of the acked records.
func (s *sink) ackedSet() map[offsetKey]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[offsetKey]bool, len(s.acked))
	for k := range s.acked {
		out[k] = true
	}
	return out
}

// logBuffer collects a stream's log lines.
type logBuffer struct{ logbuf.Buffer }

func (l *logBuffer) count(substr string) int { return l.Count(substr) }

// firstLine returns the first log line that contains substr and the time
// it was logged.
func (l *logBuffer) firstLine(substr string) (string, time.Time, bool) {
	for _, line := range strings.Split(l.String(), "\n") {
		if !strings.Contains(line, substr) {
			continue
		}
		field, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		ts, err := time.Parse(time.RFC3339Nano, field)
		return line, ts, err == nil
	}
	return "", time.Time{}, false
}

// gauges is a metrics exporter that keeps the last value of every gauge
// and the sum of every counter, by name and labels ("name,key=value,...";
// Benthos's own label and path are left out).
type gauges struct {
	mu sync.Mutex
	v  map[string]int64
}

type gaugeFn func(int64)

func (g gaugeFn) Set(v int64) { g(v) }

type noopMetric struct{}

func (noopMetric) Timing(int64) {}

type counterFn func(int64)

func (c counterFn) Incr(n int64) { c(n) }

func (g *gauges) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	return func(labelValues ...string) service.MetricsExporterCounter {
		id := metricID(name, labelKeys, labelValues)
		return counterFn(func(n int64) {
			g.mu.Lock()
			g.v[id] += n
			g.mu.Unlock()
		})
	}
}

func (g *gauges) NewTimerCtor(string, ...string) service.MetricsExporterTimerCtor {
	return func(...string) service.MetricsExporterTimer { return noopMetric{} }
}

func (g *gauges) NewGaugeCtor(name string, labelKeys ...string) service.MetricsExporterGaugeCtor {
	return func(labelValues ...string) service.MetricsExporterGauge {
		id := metricID(name, labelKeys, labelValues)
		return gaugeFn(func(v int64) {
			g.mu.Lock()
			g.v[id] = v
			g.mu.Unlock()
		})
	}
}

func metricID(name string, labelKeys, labelValues []string) string {
	id := name
	for i, k := range labelKeys {
		if k != "label" && k != "path" {
			id += fmt.Sprintf(",%s=%s", k, labelValues[i])
		}
	}
	return id
}

func (g *gauges) Close(context.Context) error { return nil }

// get returns the gauge's last value and whether it was ever set.
func (g *gauges) get(id string) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, ok := g.v[id]
	return v, ok
}

// testStream is a running Benthos stream.
type testStream struct {
	t      testing.TB
	stream *service.Stream
	done   chan struct{} // closed when Run has returned
	logs   *logBuffer
	gauges *gauges
}

// startStream runs kafka_franz (inputYAML, indented under kafka_franz:)
// into the sink; extra is appended to the stream config (a pipeline:
// section, say).
func startStream(t testing.TB, s *sink, maxInFlight int, inputYAML string, extra ...string) *testStream {
	t.Helper()
	env := service.NewEnvironment()
	err := env.RegisterBatchOutput("test_sink", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			return s, service.BatchPolicy{}, maxInFlight, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	gs := &gauges{v: map[string]int64{}}
	err = env.RegisterMetricsExporter("capture", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Logger) (service.MetricsExporter, error) { return gs, nil })
	if err != nil {
		t.Fatal(err)
	}
	b := env.NewStreamBuilder()
	logs := &logBuffer{}
	b.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	conf := fmt.Sprintf(`
http:
  enabled: false
input:
  kafka_franz:
%s
output:
  test_sink: {}
metrics:
  capture: {}
shutdown_timeout: 20s
%s
`, indent(inputYAML, "    "), strings.Join(extra, "\n"))
	if err := b.SetYAML(conf); err != nil {
		t.Fatalf("config: %v\n%s", err, conf)
	}
	stream, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	ts := &testStream{t: t, stream: stream, done: make(chan struct{}), logs: logs, gauges: gs}
	go func() {
		_ = stream.Run(context.Background())
		close(ts.done)
	}()
	t.Cleanup(func() {
		_ = ts.stream.StopWithin(30 * time.Second)
		select {
		case <-ts.done:
		case <-time.After(30 * time.Second):
		}
		if t.Failed() {
			t.Logf("stream logs:\n%s", logs.String())
		}
	})
	return ts
}

// stop stops the stream within timeout and waits until it has closed its
// components.
func (ts *testStream) stop(timeout time.Duration) {
	ts.t.Helper()
	_ = ts.stream.StopWithin(timeout)
	select {
	case <-ts.done:
	case <-time.After(waitTimeout):
		ts.t.Fatal("stream did not stop")
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

// newInput builds a kafka_franz input from its YAML, as the engine would
// (res nil: mock resources); it is not connected.
func newInput(t testing.TB, yaml string, res *service.Resources) *franzInput {
	t.Helper()
	conf, err := franzInputSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res == nil {
		res = service.MockResources()
	}
	f, err := newFranzInputFromParsed(conf, res)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// readN reads batches from f until n records came, and returns their acks.
func readN(t testing.TB, f *franzInput, n int) []service.AckFunc {
	t.Helper()
	var acks []service.AckFunc
	for read := 0; read < n; {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		batch, ack, err := f.ReadBatch(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		read += len(batch)
		acks = append(acks, ack)
	}
	return acks
}
