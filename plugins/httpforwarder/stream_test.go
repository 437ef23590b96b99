package httpforwarder

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestStream runs the output inside a real Benthos stream: rules from YAML
// decide the outcomes, every batch is acknowledged once recorded (a retry is
// a recorded PENDING row, not a nack), the metrics reach the exporter, and
// stopping the stream leaves no goroutine behind. Not parallel, for goleak.
func TestStream(t *testing.T) {
	leakOpt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leakOpt) }) // runs last

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool := pgtest.NewDBPool(t)
	b := &testBundle{ctx: ctx, dsn: dsn, pool: pool}

	rows := b.claim(t, 5, outboxdb.APITypeVehicleEvent)
	replies := map[string]func(http.ResponseWriter){
		rows[0].MessageKey: func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"code":"OK"}`)) },
		rows[1].MessageKey: func(w http.ResponseWriter) { w.WriteHeader(409) },
		rows[2].MessageKey: func(w http.ResponseWriter) { w.WriteHeader(400) },
		// A default success is a retry under these rules.
		rows[3].MessageKey: func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"result":0}`)) },
	}
	p := newPlatform(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		for key, fn := range replies {
			if strings.Contains(string(body), key) {
				fn(w)
				return
			}
		}
		w.WriteHeader(500)
	})

	env := service.NewEnvironment()
	metrics := &captureMetrics{values: map[string]int64{}}
	if err := env.RegisterMetricsExporter("capture", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Logger) (service.MetricsExporter, error) { return metrics, nil }); err != nil {
		t.Fatal(err)
	}
	sb := env.NewStreamBuilder()
	if err := sb.SetMetricsYAML("capture: {}"); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetLoggerYAML("level: none"); err != nil {
		t.Fatal(err)
	}
	send, err := sb.AddBatchProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	outConf := baseYAML(dsn, p.srv.URL, `max_in_flight: 4
rules:
  - when: 'status == 200 && body?.code == "OK"'
    outcome: success
  - when: 'status == 409'
    outcome: duplicate
  - when: 'status in [400, 422]'
    outcome: no_retry`)
	if err := sb.AddOutputYAML("http_forwarder:" + strings.ReplaceAll(outConf, "\n", "\n  ")); err != nil {
		t.Fatal(err)
	}
	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- stream.Run(ctx) }()

	mappingFailed := message(rows[4], `{"raw":1}`)
	mappingFailed.SetError(errors.New("pic_type 9 is not 1, 2, 3 or 4"))
	for _, batch := range []service.MessageBatch{
		{message(rows[0], mappedBody(rows[0])), message(rows[1], mappedBody(rows[1])), message(rows[2], mappedBody(rows[2]))},
		{message(rows[3], mappedBody(rows[3])), mappingFailed},
	} {
		if err := send(ctx, batch); err != nil {
			t.Fatalf("batch not acknowledged: %v", err)
		}
	}

	for i, want := range []string{"SUCCESS", "SUCCESS", "FAILED", "PENDING", "FAILED"} {
		if got := b.row(t, rows[i].ID); got.Status != want || len(got.Logs) != 1 {
			t.Errorf("row %d: %s with %d log rows, want %s with 1 (last_error %s)", i, got.Status, len(got.Logs), want, str(got.LastError))
		}
	}

	if err := stream.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("stream run: %v", err)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   int64
	}{
		{"forwarder_attempts_total", []string{"api_type", "VEHICLE_EVENT", "outcome", "success"}, 1},
		{"forwarder_attempts_total", []string{"api_type", "VEHICLE_EVENT", "outcome", "duplicate"}, 1},
		{"forwarder_attempts_total", []string{"api_type", "VEHICLE_EVENT", "outcome", "no_retry"}, 1},
		{"forwarder_attempts_total", []string{"api_type", "VEHICLE_EVENT", "outcome", "retry"}, 1},
		{"forwarder_mapping_errors_total", []string{"api_type", "VEHICLE_EVENT"}, 1},
		{"forwarder_forward_latency_seconds", []string{"api_type", "VEHICLE_EVENT"}, 4}, // observations
		{"forwarder_end_to_end_latency_seconds", []string{"api_type", "VEHICLE_EVENT"}, 2},
		{"forwarder_semaphore_available_permits", nil, 4},
	} {
		if got := metrics.get(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %d, want %d\nall: %v", c.name, c.labels, got, c.want, metrics.dump())
		}
	}
	for _, line := range metrics.dump() {
		if strings.Contains(line, testAccessName) || strings.Contains(line, testAccessPwd) {
			t.Errorf("credential in metric %s", line)
		}
	}
}

// captureMetrics is a metrics exporter that keeps counter sums, gauge values
// and timer observation counts by name and labels.
type captureMetrics struct {
	mu     sync.Mutex
	values map[string]int64
}

type captureMetric struct {
	c   *captureMetrics
	key string
	set bool // a gauge: keep the last value
}

func (m captureMetric) Incr(n int64) { m.add(n) }

// Timing counts observations. A negative one only creates the series at 0
// (internal/metricseries) and is not an observation, as in the Prometheus
// exporter.
func (m captureMetric) Timing(d int64) {
	if d >= 0 {
		m.add(1)
	}
}
func (m captureMetric) Set(v int64) { m.add(v) }

func (m captureMetric) add(n int64) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.set {
		m.c.values[m.key] = n
		return
	}
	m.c.values[m.key] += n
}

func metricKey(name string, keys, values []string) string {
	pairs := make([]string, len(keys))
	for i := range keys {
		pairs[i] = keys[i] + "=" + values[i]
	}
	sort.Strings(pairs)
	return name + "{" + strings.Join(pairs, ",") + "}"
}

func (c *captureMetrics) NewCounterCtor(name string, keys ...string) service.MetricsExporterCounterCtor {
	return func(values ...string) service.MetricsExporterCounter {
		return captureMetric{c: c, key: metricKey(name, keys, values)}
	}
}

func (c *captureMetrics) NewTimerCtor(name string, keys ...string) service.MetricsExporterTimerCtor {
	return func(values ...string) service.MetricsExporterTimer {
		return captureMetric{c: c, key: metricKey(name, keys, values)}
	}
}

func (c *captureMetrics) NewGaugeCtor(name string, keys ...string) service.MetricsExporterGaugeCtor {
	return func(values ...string) service.MetricsExporterGauge {
		return captureMetric{c: c, key: metricKey(name, keys, values), set: true}
	}
}

func (c *captureMetrics) Close(context.Context) error { return nil }

// get sums the series of name whose labels include the given pairs (Benthos
// adds its own, such as label and path).
func (c *captureMetrics) get(name string, labels ...string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	for k, v := range c.values {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			pair := labels[i] + "=" + labels[i+1]
			if !strings.Contains(k, "{"+pair+",") && !strings.Contains(k, ","+pair+",") &&
				!strings.Contains(k, ","+pair+"}") && !strings.Contains(k, "{"+pair+"}") {
				match = false
			}
		}
		if match {
			sum += v
		}
	}
	return sum
}

func (c *captureMetrics) dump() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, v := range c.values {
		out = append(out, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(out)
	return out
}
