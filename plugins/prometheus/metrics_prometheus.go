// Package prometheus provides the prometheus metrics exporter: every Benthos
// and plugin metric, plus the outbox record gauges, from a private
// client_golang registry, served at /metrics on Benthos's HTTP server.
package prometheus

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	pmFieldUseHistogramTiming = "use_histogram_timing"
	pmFieldHistogramBuckets   = "histogram_buckets"
	pmFieldSummaryObjectives  = "summary_quantiles_objectives"
	pmFieldObjQuantile        = "quantile"
	pmFieldObjError           = "error"
	pmFieldAddProcessMetrics  = "add_process_metrics"
	pmFieldAddGoMetrics       = "add_go_metrics"
	pmFieldFileOutputPath     = "file_output_path"
	pmFieldOutbox             = "outbox"
	pmFieldOutboxRefresh      = "refresh_interval"
)

// secondsSuffix marks a timer that is always a histogram in seconds
// (docs/components.md: our timers end in _seconds).
const secondsSuffix = "_seconds"

// defaultSecondsBuckets serve the _seconds timers when histogram_buckets is
// empty: prometheus.DefBuckets (5 ms to 10 s, a platform request) extended to
// 30 min, because the end-to-end latency of a retried row spans minutes.
var defaultSecondsBuckets = append(slices.Clone(prometheus.DefBuckets), 30, 60, 120, 300, 600, 1800)

var prometheusSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Summary("Serves every metric in the Prometheus text format at `/metrics` (and `/stats`) of the service-wide HTTP server, plus the outbox record gauges.").
		Description(`
Metrics live in a private registry (no global state), so only this process's pipeline
metrics are exported: Benthos's own (`+"`input_received`"+`, `+"`output_sent`"+`, `+"`output_error`"+`,
`+"`processor_latency_ns`"+` …, labelled `+"`label`"+` and `+"`path`"+`) and those of the forwarder's
plugins (`+"`forwarder_*`"+`, see docs/components.md). Metric names and label keys that are not valid
Prometheus names have their invalid characters replaced with `+"`_`"+`.

### Types

- Counters are Prometheus counters (`+"`IncrFloat64`"+` supported; negative increments are ignored,
  a counter never goes down). Gauges are gauges, integer or float.
- Timers whose name ends in `+"`_seconds`"+` are histograms in seconds, always: that is the convention of
  the forwarder's plugins. Their default buckets run from 5 ms to 30 min.
- Other timers (Benthos's `+"`*_latency_ns`"+`) are summaries of nanoseconds, with the quantiles of
  `+"`summary_quantiles_objectives`"+`, or histograms in seconds (`+"`prometheus.DefBuckets`"+` by default,
  name unchanged) when `+"`use_histogram_timing`"+` is true, as in Redpanda Connect's exporter.
- `+"`histogram_buckets`"+`, when set, replaces the buckets of every histogram.
- A name registered twice with a different type or different label keys keeps its first
  registration; the second is logged once and dropped.

### Outbox record gauges

With the `+"`outbox`"+` block, a background refresher reads `+"`forward_records`"+` every
`+"`refresh_interval`"+` and a scrape serves its last snapshot, so a scrape never queries the database:
`+"`forwarder_records_pending`"+`, `+"`forwarder_records_in_progress`"+`, `+"`forwarder_records_failed`"+`
(exact), `+"`forwarder_records_success`"+` (exact on small tables, an estimate with an error well under 1 %
on large ones) and `+"`forwarder_oldest_pending_age_seconds`"+` (how long the earliest-due row has waited
for a dispatcher; 0 when none is due), the ordering gauges `+"`forwarder_ordering_held_rows`"+`,
`+"`forwarder_ordering_blocked_keys`"+`, `+"`forwarder_ordering_oldest_held_age_seconds`"+` and
`+"`forwarder_ordering_oldest_blocked_age_seconds`"+`, all single unlabelled series, plus
`+"`forwarder_outbox_gauges_last_refresh_timestamp_seconds`"+`. The refresh reads no SUCCESS row: it costs
about a millisecond at 10 M finished rows (plugins/prometheus/README.md gives the accuracy of each gauge).
The series appear after the first successful refresh; while the database is unreachable the last
snapshot is served and the failure is logged once. Every instance refreshes on its own: aggregate the
gauges across instances with `+"`max`"+`, not `+"`sum`"+`.`).
		Fields(
			service.NewBoolField(pmFieldUseHistogramTiming).
				Description("Export timers not ending in `_seconds` as histograms in seconds instead of summaries in nanoseconds.").
				Default(false).
				Advanced(),
			service.NewFloatListField(pmFieldHistogramBuckets).
				Description("Bucket upper bounds (seconds) of every histogram. Empty: 5 ms to 30 min for `_seconds` timers, `prometheus.DefBuckets` for the others.").
				Default([]any{}).
				Example([]any{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60}).
				LintRule(fieldlint.Rule(lintBuckets)).
				Advanced(),
			service.NewObjectListField(pmFieldSummaryObjectives,
				service.NewFloatField(pmFieldObjQuantile).
					Description("Quantile to report, in (0, 1].").
					Example(0.9),
				service.NewFloatField(pmFieldObjError).
					Description("Allowed absolute error of the quantile.").
					Example(0.01),
			).
				Description("Quantiles of the summaries (timers when `use_histogram_timing` is false).").
				Default([]any{
					map[string]any{pmFieldObjQuantile: 0.5, pmFieldObjError: 0.05},
					map[string]any{pmFieldObjQuantile: 0.9, pmFieldObjError: 0.01},
					map[string]any{pmFieldObjQuantile: 0.99, pmFieldObjError: 0.001},
				}).
				LintRule(fieldlint.Rule(lintObjectives)).
				Advanced(),
			service.NewBoolField(pmFieldAddProcessMetrics).
				Description("Add the standard process collector (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …).").
				Default(false),
			service.NewBoolField(pmFieldAddGoMetrics).
				Description("Add the standard Go runtime collector (`go_goroutines`, `go_memstats_*`, …).").
				Default(false),
			service.NewStringField(pmFieldFileOutputPath).
				Description("When set, the metrics are written to this file in the text format when the service stops (replaced atomically).").
				Default("").
				Advanced(),
			service.NewObjectField(pmFieldOutbox, append(streamdb.DSNFields(),
				service.NewDurationField(pmFieldOutboxRefresh).
					Description("How often the record gauges are re-read. A scrape serves the last snapshot. The pool (one connection) is opened at the first refresh. One refresh may take this long, at least 5s and at most 30s; refreshes never overlap.").
					Default("15s").
					LintRule(fieldlint.Duration(pmFieldOutbox+"."+pmFieldOutboxRefresh, checkRefreshInterval)))...,
			).
				Description("Export the outbox record gauges of `forward_records`. Omit to export pipeline metrics only.").
				Optional(),
		).
		Example("Forwarder", "Every metric at `/metrics`, with the outbox record gauges and the process and Go collectors.", `
http:
  address: ${HTTP_ADDR:0.0.0.0:4195}
metrics:
  prometheus:
    add_process_metrics: true
    add_go_metrics: true
    outbox:
      refresh_interval: 15s
`)
})

func init() {
	service.MustRegisterMetricsExporter("prometheus", prometheusSpec(), newPromExporterFromParsed)
}

// family is one metric name's collector, kept so that every component that
// asks for the name shares it.
type family struct {
	kind      string // "counter", "gauge" or "timer"
	labelKeys []string
	counter   *prometheus.CounterVec
	gauge     *prometheus.GaugeVec
	observer  prometheus.ObserverVec
	// scale converts a timer's nanoseconds into the exported unit.
	scale float64
}

type promExporter struct {
	log        *service.Logger
	reg        *prometheus.Registry
	handler    http.Handler
	useHist    bool
	buckets    []float64
	objectives map[float64]float64
	filePath   string
	outbox     *outboxGauges

	mu       sync.Mutex
	families map[string]*family
	dropped  map[string]bool
}

// lintBuckets checks histogram_buckets as the constructor does. Benthos
// also runs a list field's rule on each element: only the list is checked.
func lintBuckets(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	buckets := make([]float64, len(list))
	for i, e := range list {
		if buckets[i], ok = fieldlint.ToFloat(e); !ok {
			return nil
		}
	}
	if err := checkBuckets(buckets); err != nil {
		return []string{err.Error()}
	}
	return nil
}

func checkBuckets(buckets []float64) error {
	if !slices.IsSorted(buckets) {
		return fmt.Errorf("%s must be in increasing order, got %v", pmFieldHistogramBuckets, buckets)
	}
	return nil
}

// checkObjective checks entry i of summary_quantiles_objectives.
func checkObjective(i int, q, qe float64) error {
	if !(q > 0 && q <= 1 && qe >= 0 && qe < 1) {
		return fmt.Errorf("%s[%d]: quantile must be in (0, 1] and error in [0, 1), got %v and %v", pmFieldSummaryObjectives, i, q, qe)
	}
	return nil
}

// lintObjectives checks summary_quantiles_objectives as the constructor
// does, naming each entry by its index.
func lintObjectives(v any) []string {
	list, _ := v.([]any)
	var lints []string
	for i, e := range list {
		o, _ := e.(map[string]any)
		q, ok1 := fieldlint.ToFloat(o[pmFieldObjQuantile])
		qe, ok2 := fieldlint.ToFloat(o[pmFieldObjError])
		if !ok1 || !ok2 {
			continue
		}
		if err := checkObjective(i, q, qe); err != nil {
			lints = append(lints, err.Error())
		}
	}
	return lints
}

func newPromExporterFromParsed(conf *service.ParsedConfig, log *service.Logger) (service.MetricsExporter, error) {
	e := &promExporter{
		log:        log,
		reg:        prometheus.NewRegistry(),
		objectives: map[float64]float64{},
		families:   map[string]*family{},
		dropped:    map[string]bool{},
	}
	var err error
	e.useHist = pluginconf.Field(&err, conf.FieldBool, pmFieldUseHistogramTiming)
	e.buckets = pluginconf.Field(&err, conf.FieldFloatList, pmFieldHistogramBuckets)
	objs := pluginconf.Field(&err, conf.FieldObjectList, pmFieldSummaryObjectives)
	e.filePath = pluginconf.Field(&err, conf.FieldString, pmFieldFileOutputPath)
	addProcess := pluginconf.Field(&err, conf.FieldBool, pmFieldAddProcessMetrics)
	addGo := pluginconf.Field(&err, conf.FieldBool, pmFieldAddGoMetrics)
	if err != nil {
		return nil, err
	}
	if err := checkBuckets(e.buckets); err != nil {
		return nil, err
	}
	for i, o := range objs {
		q := pluginconf.Field(&err, o.FieldFloat, pmFieldObjQuantile)
		qe := pluginconf.Field(&err, o.FieldFloat, pmFieldObjError)
		if err != nil {
			return nil, err
		}
		if err := checkObjective(i, q, qe); err != nil {
			return nil, err
		}
		e.objectives[q] = qe
	}
	if addProcess {
		e.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if addGo {
		e.reg.MustRegister(collectors.NewGoCollector())
	}

	if conf.Contains(pmFieldOutbox) {
		oconf := conf.Namespace(pmFieldOutbox)
		dsn, err := streamdb.DSNFromParsed(oconf)
		if err != nil {
			return nil, err
		}
		interval, err := conf.FieldDuration(pmFieldOutbox, pmFieldOutboxRefresh)
		if err != nil {
			return nil, err
		}
		if err := checkRefreshInterval(interval); err != nil {
			return nil, err
		}
		direct, err := streamdb.DirectDSNFromParsed(oconf)
		if err != nil {
			return nil, err
		}
		// Parsed now so that a bad DSN fails at start-up, without a
		// connection. A direct connection string says that dsn leads to a
		// transaction pooler: statements without server-side prepared ones.
		poolCfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{MaxConns: 1,
			ApplicationName: outboxdb.MetricsApplicationName, Pooled: direct != ""})
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", pmFieldOutbox, streamdb.DSNSource(oconf), err)
		}
		e.outbox = newOutboxGauges(outboxGaugesConfig{RefreshInterval: interval}, poolCfg, log)
		if err := e.reg.Register(e.outbox); err != nil {
			return nil, fmt.Errorf("registering the outbox record gauges: %w", err)
		}
		e.outbox.start()
	}

	e.handler = promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{log},
		ErrorHandling: promhttp.ContinueOnError,
	})
	return e, nil
}

var (
	invalidNameChars  = regexp.MustCompile(`[^a-zA-Z0-9_:]`)
	invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)
)

func sanitizeName(s string, invalid *regexp.Regexp) string {
	s = invalid.ReplaceAllString(s, "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "_" + s
	}
	return s
}

// getFamily returns the collector for name, creating and registering it on
// first use, or nil when the name is taken by another type or label set.
func (e *promExporter) getFamily(kind, name string, labelKeys []string) *family {
	name = sanitizeName(name, invalidNameChars)
	keys := make([]string, len(labelKeys))
	for i, k := range labelKeys {
		keys[i] = sanitizeName(k, invalidLabelChars)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if f, ok := e.families[name]; ok {
		if f.kind == kind && slices.Equal(f.labelKeys, keys) {
			return f
		}
		e.dropOnce(name, fmt.Sprintf("already registered as a %s with labels %v, not a %s with labels %v", f.kind, f.labelKeys, kind, keys))
		return nil
	}

	f := &family{kind: kind, labelKeys: keys}
	help := "Benthos " + kind + " " + name + "."
	var c prometheus.Collector
	switch kind {
	case "counter":
		f.counter = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, keys)
		c = f.counter
	case "gauge":
		f.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, keys)
		c = f.gauge
	default:
		switch {
		case strings.HasSuffix(name, secondsSuffix) || e.useHist:
			buckets := e.buckets
			if len(buckets) == 0 {
				buckets = prometheus.DefBuckets
				if strings.HasSuffix(name, secondsSuffix) {
					buckets = defaultSecondsBuckets
				}
			}
			f.observer = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, keys)
			f.scale = 1 / float64(time.Second)
		default:
			f.observer = prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: name, Help: help, Objectives: e.objectives}, keys)
			f.scale = 1
		}
		c = f.observer
	}
	if err := e.reg.Register(c); err != nil {
		// A clash with a collector of ours (the outbox gauges, the process
		// and Go collectors) or an invalid name.
		e.dropOnce(name, err.Error())
		return nil
	}
	e.families[name] = f
	return f
}

func (e *promExporter) dropOnce(name, why string) {
	if e.dropped[name] {
		return
	}
	e.dropped[name] = true
	e.log.Warnf("prometheus: metric %s is not exported: %s", name, why)
}

// NewCounterCtor implements service.MetricsExporter.
func (e *promExporter) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	f := e.getFamily("counter", name, labelKeys)
	return seriesCtor(f, func(v []string) (prometheus.Counter, error) { return f.counter.GetMetricWithLabelValues(v...) },
		func(c prometheus.Counter) service.MetricsExporterCounter { return promCounter{c} })
}

// NewGaugeCtor implements service.MetricsExporter.
func (e *promExporter) NewGaugeCtor(name string, labelKeys ...string) service.MetricsExporterGaugeCtor {
	f := e.getFamily("gauge", name, labelKeys)
	return seriesCtor(f, func(v []string) (prometheus.Gauge, error) { return f.gauge.GetMetricWithLabelValues(v...) },
		func(g prometheus.Gauge) service.MetricsExporterGauge { return promGauge{g} })
}

// NewTimerCtor implements service.MetricsExporter; see getFamily for the
// histogram or summary choice.
func (e *promExporter) NewTimerCtor(name string, labelKeys ...string) service.MetricsExporterTimerCtor {
	f := e.getFamily("timer", name, labelKeys)
	return seriesCtor(f, func(v []string) (prometheus.Observer, error) { return f.observer.GetMetricWithLabelValues(v...) },
		func(o prometheus.Observer) service.MetricsExporterTimer { return promTimer{o, f.scale} })
}

// seriesCtor makes the series constructor Benthos asks for: the series of
// some label values is looked up in f and wrapped in Benthos's interface S.
// A family that is not exported (nil) or label values it refuses give a
// series that does nothing, as a metric Benthos cannot export must not stop
// the component that reports it.
func seriesCtor[M, S any](f *family, lookup func(labelValues []string) (M, error), wrap func(M) S) func(labelValues ...string) S {
	noop := any(noopMetric{}).(S)
	return func(labelValues ...string) S {
		if f == nil {
			return noop
		}
		m, err := lookup(labelValues)
		if err != nil {
			return noop
		}
		return wrap(m)
	}
}

// HandlerFunc makes Benthos serve the registry at /metrics and /stats.
func (e *promExporter) HandlerFunc() http.HandlerFunc {
	return e.handler.ServeHTTP
}

// Close stops the outbox refresher and writes file_output_path.
func (e *promExporter) Close(ctx context.Context) error {
	if e.outbox != nil {
		e.outbox.stop()
	}
	if e.filePath != "" {
		if err := prometheus.WriteToTextfile(e.filePath, e.reg); err != nil {
			return fmt.Errorf("writing metrics to %s: %w", pmFieldFileOutputPath, err)
		}
	}
	return nil
}

type promCounter struct{ c prometheus.Counter }

func (p promCounter) Incr(n int64) { p.IncrFloat64(float64(n)) }

// IncrFloat64 ignores negative deltas: a Prometheus counter panics on them,
// and a rate() would read a decrease as a reset.
func (p promCounter) IncrFloat64(n float64) {
	if n > 0 {
		p.c.Add(n)
	}
}

type promGauge struct{ g prometheus.Gauge }

// Benthos keeps a gauge's running value itself and hands the exporter
// only Set and SetFloat64.
func (p promGauge) Set(v int64)          { p.g.Set(float64(v)) }
func (p promGauge) SetFloat64(v float64) { p.g.Set(v) }

type promTimer struct {
	o     prometheus.Observer
	scale float64
}

// Timing observes a duration. A negative one, which no measurement gives,
// only creates the series: components use it to export their histograms at
// 0 before the first event (internal/metricseries).
func (p promTimer) Timing(ns int64) {
	if ns >= 0 {
		p.o.Observe(float64(ns) * p.scale)
	}
}

type noopMetric struct{}

func (noopMetric) Incr(int64)          {}
func (noopMetric) IncrFloat64(float64) {}
func (noopMetric) Set(int64)           {}
func (noopMetric) SetFloat64(float64)  {}
func (noopMetric) Timing(int64)        {}

// promLogger routes promhttp's encoding errors to the Benthos logger.
type promLogger struct{ log *service.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn(strings.TrimSpace(fmt.Sprintln(v...))) }

// checkRefreshInterval is the check of outbox.refresh_interval, which
// start-up runs on the parsed value and lint (fieldlint) on the value
// written.
var checkRefreshInterval = fieldlint.Range(1, fieldlint.MaxDuration, pmFieldOutbox+"."+pmFieldOutboxRefresh+" must be positive, got %v")
