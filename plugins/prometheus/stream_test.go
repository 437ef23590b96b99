package prometheus

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	// generate and drop, for the test streams.
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// registerFakeForwarder adds a processor that publishes metrics the way the
// forwarder's plugins do (res.Metrics(), docs/components.md names), so the
// test sees plugin metrics without importing a sibling plugin.
func registerFakeForwarder(t *testing.T, env *service.Environment) {
	t.Helper()
	err := env.RegisterBatchProcessor("fake_forwarder", service.NewConfigSpec(),
		func(_ *service.ParsedConfig, mgr *service.Resources) (service.BatchProcessor, error) {
			m := mgr.Metrics()
			return &fakeForwarder{
				attempts: m.NewCounter("forwarder_attempts_total", "api_type", "outcome"),
				latency:  m.NewTimer("forwarder_forward_latency_seconds", "api_type"),
				permits:  m.NewGauge("forwarder_semaphore_available_permits"),
			}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
}

type fakeForwarder struct {
	attempts *service.MetricCounter
	latency  *service.MetricTimer
	permits  *service.MetricGauge
}

func (f *fakeForwarder) ProcessBatch(_ context.Context, b service.MessageBatch) ([]service.MessageBatch, error) {
	for range b {
		f.attempts.Incr(1, "HEARTBEAT", "success")
		f.latency.Timing(int64(250*time.Millisecond), "HEARTBEAT")
	}
	f.permits.Set(99)
	return []service.MessageBatch{b}, nil
}

func (f *fakeForwarder) Close(context.Context) error { return nil }

func freePort(t *testing.T) int {
	t.Helper()
	port, err := childproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestStreamScrape runs a real stream with the exporter and Benthos's HTTP
// server, and scrapes /metrics like Prometheus would. Sequential, for goleak.
func TestStreamScrape(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

	dsn, pool := pgtest.NewDBPool(t)
	insertRows(t, pool, "p", "PENDING", 5, -time.Minute)
	insertRows(t, pool, "i", "IN_PROGRESS", 2, time.Minute)
	insertRows(t, pool, "s", "SUCCESS", 40, 0)
	insertRows(t, pool, "f", "FAILED", 3, 0)

	env := service.NewEnvironment()
	registerFakeForwarder(t, env)
	port := freePort(t)
	sb := env.NewStreamBuilder()
	if err := sb.SetYAML(fmt.Sprintf(`
http:
  enabled: true
  address: 127.0.0.1:%d
input:
  label: events
  generate:
    interval: 5ms
    mapping: 'root = {"n": counter()}'
pipeline:
  processors:
    - label: dispatch
      fake_forwarder: {}
output:
  label: platform
  drop: {}
metrics:
  prometheus:
    outbox:
      dsn: '%s'
      refresh_interval: 50ms
logger:
  level: warn
`, port, dsn)); err != nil {
		t.Fatal(err)
	}
	strm, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- strm.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := strm.Stop(ctx); err != nil {
			t.Errorf("stopping the stream: %v", err)
		}
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stream run: %v", err)
		}
	})

	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	// until scrapes /metrics until ready says the scrape is complete.
	until := func(what string, ready func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		var fams map[string]*dto.MetricFamily
		for {
			var ok bool
			if fams, ok = scrapeURL(t, url); ok && ready(fams) {
				return fams
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never showed on %s; families: %v", what, url, keys(fams))
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	counter := func(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
		return metricWith(fams, name, labels).GetCounter().GetValue()
	}

	want := countsByStatus(t, pool)
	fams := until("the record gauges and pipeline traffic", func(f map[string]*dto.MetricFamily) bool {
		return equalCounts(recordGauges(f), want) &&
			counter(f, "output_sent", map[string]string{"label": "platform"}) > 0
	})

	// Benthos's own metrics, labelled by component.
	if v := counter(fams, "input_received", map[string]string{"label": "events", "path": "root.input"}); v < 1 {
		t.Errorf("input_received{label=events} = %v", v)
	}
	for _, name := range []string{"output_sent", "output_batch_sent", "output_error", "output_connection_up"} {
		if metricWith(fams, name, map[string]string{"label": "platform", "path": "root.output"}) == nil {
			t.Errorf("%s{label=platform,path=root.output} missing", name)
		}
	}
	if f := fams["processor_latency_ns"]; f.GetType() != dto.MetricType_SUMMARY {
		t.Errorf("processor_latency_ns is %v, want a summary", f.GetType())
	}

	// Plugin metrics: labels of the component first, then the plugin's own.
	proc := map[string]string{"label": "dispatch", "path": "root.pipeline.processors.0", "api_type": "HEARTBEAT"}
	if v := counter(fams, "forwarder_attempts_total", map[string]string{"outcome": "success", "api_type": "HEARTBEAT"}); v < 1 {
		t.Errorf("forwarder_attempts_total{outcome=success} = %v", v)
	}
	if h := metricWith(fams, "forwarder_forward_latency_seconds", proc).GetHistogram(); h.GetSampleCount() == 0 ||
		h.GetSampleSum() != 0.25*float64(h.GetSampleCount()) {
		t.Errorf("forwarder_forward_latency_seconds = %v, want a histogram of 0.25 s samples", h)
	}
	if g := metricWith(fams, "forwarder_semaphore_available_permits", nil).GetGauge().GetValue(); g != 99 {
		t.Errorf("forwarder_semaphore_available_permits = %v, want 99", g)
	}

	// The record gauges are single unlabelled series equal to the database.
	for _, name := range []string{metricRecordsPending, metricRecordsInProgress, metricRecordsSuccess, metricRecordsFailed, metricOldestPendingAge} {
		if f := fams[name]; f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 || len(f.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("%s: want one unlabelled gauge, got %v", name, f)
		}
	}
	if age := fams[metricOldestPendingAge].GetMetric()[0].GetGauge().GetValue(); age < 60 {
		t.Errorf("%s = %v, want at least the 60 s the PENDING rows have been due", metricOldestPendingAge, age)
	}

	// The gauges follow the table.
	if _, err := fixture.Deliver(context.Background(), pool, "status = 'PENDING'"); err != nil {
		t.Fatal(err)
	}
	insertRows(t, pool, "f2", "FAILED", 4, 0)
	want = countsByStatus(t, pool)
	until("the updated record gauges", func(f map[string]*dto.MetricFamily) bool {
		return equalCounts(recordGauges(f), want)
	})
}
