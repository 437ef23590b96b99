package prometheus

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestExporter(t *testing.T) {
	t.Parallel()

	t.Run("CountersAndGauges", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `{}`, nil)

		ctor := e.NewCounterCtor("input_received", "label", "path")
		c := ctor("in", "root.input")
		c.Incr(2)
		c.(interface{ IncrFloat64(float64) }).IncrFloat64(0.5)
		c.Incr(-7) // a counter never goes down
		ctor("in", "root.input").Incr(1)

		e.NewGaugeCtor("forwarder_semaphore_available_permits", "label", "path")("out", "root.output").Set(42)
		e.NewGaugeCtor("float_gauge")().(interface{ SetFloat64(float64) }).SetFloat64(0.25)

		fams := scrapeHandler(t, e)
		in := metricWith(fams, "input_received", map[string]string{"label": "in", "path": "root.input"})
		if in == nil || in.GetCounter().GetValue() != 3.5 {
			t.Fatalf("input_received = %v, want counter 3.5", in)
		}
		if fams["input_received"].GetType() != dto.MetricType_COUNTER {
			t.Errorf("input_received type = %v", fams["input_received"].GetType())
		}
		if g := metricWith(fams, "forwarder_semaphore_available_permits", map[string]string{"label": "out"}); g == nil || g.GetGauge().GetValue() != 42 {
			t.Errorf("forwarder_semaphore_available_permits = %v, want 42", g)
		}
		if g := metricWith(fams, "float_gauge", nil); g == nil || g.GetGauge().GetValue() != 0.25 {
			t.Errorf("float_gauge = %v, want 0.25", g)
		}
	})

	t.Run("SecondsTimersAreHistogramsInSeconds", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `{}`, nil)
		tm := e.NewTimerCtor("forwarder_forward_latency_seconds", "label", "path", "api_type")("out", "root.output", "HEARTBEAT")
		tm.Timing(int64(1500 * time.Millisecond))
		tm.Timing(int64(90 * time.Second))

		fams := scrapeHandler(t, e)
		f := fams["forwarder_forward_latency_seconds"]
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("type = %v, want histogram", f.GetType())
		}
		h := metricWith(fams, "forwarder_forward_latency_seconds", map[string]string{"api_type": "HEARTBEAT"}).GetHistogram()
		if h.GetSampleCount() != 2 || h.GetSampleSum() != 91.5 {
			t.Errorf("count %d sum %v, want 2 and 91.5 (seconds)", h.GetSampleCount(), h.GetSampleSum())
		}
		if bounds := upperBounds(h); !slices.Equal(bounds, defaultSecondsBuckets) {
			t.Errorf("buckets %v, want %v", bounds, defaultSecondsBuckets)
		}
	})

	t.Run("BenthosTimersAreSummariesOfNanoseconds", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `{}`, nil)
		e.NewTimerCtor("output_latency_ns", "label", "path")("out", "root.output").Timing(2_000_000)

		fams := scrapeHandler(t, e)
		f := fams["output_latency_ns"]
		if f.GetType() != dto.MetricType_SUMMARY {
			t.Fatalf("type = %v, want summary", f.GetType())
		}
		s := f.GetMetric()[0].GetSummary()
		if s.GetSampleSum() != 2_000_000 || len(s.GetQuantile()) != 3 {
			t.Errorf("sum %v quantiles %d, want 2e6 ns and 3 quantiles", s.GetSampleSum(), len(s.GetQuantile()))
		}
	})

	t.Run("UseHistogramTiming", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `use_histogram_timing: true`, nil)
		e.NewTimerCtor("output_latency_ns", "label", "path")("out", "root.output").Timing(2_000_000)

		fams := scrapeHandler(t, e)
		f := fams["output_latency_ns"]
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("type = %v, want histogram", f.GetType())
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleSum() != 0.002 || !slices.Equal(upperBounds(h), prometheus.DefBuckets) {
			t.Errorf("sum %v with buckets %v, want 0.002 s with the default buckets", h.GetSampleSum(), upperBounds(h))
		}
	})

	t.Run("CustomBuckets", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `histogram_buckets: [0.1, 1, 10]`, nil)
		e.NewTimerCtor("forwarder_end_to_end_latency_seconds", "api_type")("VEHICLE_EVENT").Timing(int64(3 * time.Second))

		h := scrapeHandler(t, e)["forwarder_end_to_end_latency_seconds"].GetMetric()[0].GetHistogram()
		var got []uint64
		for _, b := range h.GetBucket() {
			got = append(got, b.GetCumulativeCount())
		}
		if !slices.Equal(upperBounds(h), []float64{0.1, 1, 10}) || !slices.Equal(got, []uint64{0, 0, 1, 1}) {
			t.Errorf("buckets %v with cumulative counts %v, want 0.1, 1, 10 (+Inf) with 0, 0, 1, 1", upperBounds(h), got)
		}
	})

	t.Run("InvalidNamesAreSanitised", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `{}`, nil)
		e.NewCounterCtor("my.custom-metric", "the.label")("v").Incr(1)

		fams := scrapeHandler(t, e)
		if m := metricWith(fams, "my_custom_metric", map[string]string{"the_label": "v"}); m == nil {
			t.Errorf("sanitised series missing; families: %v", keys(fams))
		}
	})

	t.Run("ConflictingRegistrationIsDroppedOnce", func(t *testing.T) {
		t.Parallel()
		log, logs := newTestLogger()
		e := newTestExporter(t, `{}`, log)
		e.NewCounterCtor("shared", "a")("1").Incr(5)
		// Same name, another type or label set: dropped, never a panic.
		e.NewGaugeCtor("shared", "a")("1").Set(99)
		e.NewCounterCtor("shared", "b")("1").Incr(99)
		e.NewCounterCtor("shared", "b")("1").Incr(99)
		// Wrong number of label values: dropped.
		e.NewCounterCtor("shared", "a")("1", "2").Incr(99)

		m := metricWith(scrapeHandler(t, e), "shared", map[string]string{"a": "1"})
		if m == nil || m.GetCounter().GetValue() != 5 {
			t.Errorf("shared = %v, want the first registration's 5", m)
		}
		if n := logs.count("WARN", "metric shared is not exported"); n != 1 {
			t.Errorf("%d warnings, want 1:\n%s", n, logs)
		}
	})

	t.Run("ClashWithRecordGaugesIsDropped", func(t *testing.T) {
		t.Parallel()
		e := newTestExporter(t, `
outbox:
  dsn: postgres://127.0.0.1:1/none
  refresh_interval: 1h
`, nil)
		// The exporter owns the record gauges; a plugin cannot shadow them.
		e.NewGaugeCtor(metricRecordsPending)().Set(7)
		if _, ok := scrapeHandler(t, e)[metricRecordsPending]; ok {
			t.Errorf("%s exported before any refresh", metricRecordsPending)
		}
	})

	t.Run("StandardCollectors", func(t *testing.T) {
		t.Parallel()
		fams := scrapeHandler(t, newTestExporter(t, `{}`, nil))
		for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
			if _, ok := fams[name]; ok {
				t.Errorf("%s exported without being asked for", name)
			}
		}
		fams = scrapeHandler(t, newTestExporter(t, "add_process_metrics: true\nadd_go_metrics: true", nil))
		for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
			if _, ok := fams[name]; !ok {
				t.Errorf("%s missing with the standard collectors on", name)
			}
		}
	})

	t.Run("FileOutputOnClose", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "metrics.prom")
		e := newTestExporter(t, "file_output_path: "+path, nil)
		e.NewCounterCtor("output_sent", "label", "path")("out", "root.output").Incr(12)
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("file written before Close: %v", err)
		}
		if err := e.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("opening the output file: %v", err)
		}
		defer f.Close()
		m := metricWith(parseText(t, f), "output_sent", map[string]string{"label": "out"})
		if m == nil || m.GetCounter().GetValue() != 12 {
			t.Errorf("output_sent in file = %v, want 12", m)
		}
	})

	t.Run("ConfigErrors", func(t *testing.T) {
		t.Parallel()
		for name, yaml := range map[string]string{
			"UnsortedBuckets": `histogram_buckets: [1, 0.5]`,
			"BadQuantile":     `summary_quantiles_objectives: [{quantile: 1.5, error: 0.1}]`,
			"BadDSN":          "outbox:\n  dsn: 'postgres://a b c:::/x?sslmode=nonsense'",
			"ZeroInterval":    "outbox:\n  dsn: postgres://localhost/x\n  refresh_interval: 0s",
		} {
			conf, err := prometheusSpec().ParseYAML(yaml, nil)
			if err != nil {
				t.Fatalf("%s: parsing: %v", name, err)
			}
			if _, err := newPromExporterFromParsed(conf, nil); err == nil {
				t.Errorf("%s: no error", name)
			} else if strings.Contains(err.Error(), "a b c") {
				t.Errorf("%s: error leaks the DSN: %v", name, err)
			}
		}
	})
}

// upperBounds lists a histogram's finite bucket bounds (the text format
// adds +Inf).
func upperBounds(h *dto.Histogram) []float64 {
	var bs []float64
	for _, b := range h.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) {
			bs = append(bs, b.GetUpperBound())
		}
	}
	return bs
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
