package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metrics is one scrape of a process's /metrics, by family name.
//
// Every series of a component metric carries the component's labels first
// (label="platform",path="root.output",reason="lease"), so a series is
// looked up by the labels that matter to the check, a subset of its own,
// never by its whole label set spelled out.
type metrics map[string]*dto.MetricFamily

// scrapeMetrics reads and parses p's /metrics.
func scrapeMetrics(ctx context.Context, p *proc) (metrics, error) {
	code, body, err := p.get(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s: GET /metrics: %w", p.name, err)
	}
	if code != 200 {
		return nil, fmt.Errorf("%s: GET /metrics: status %d", p.name, code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: parsing /metrics: %w", p.name, err)
	}
	return metrics(fams), nil
}

// mustScrape is scrapeMetrics failing the test when p's metrics cannot be
// read: a check of them must not pass on a page that was never seen.
func mustScrape(t *testing.T, ctx context.Context, p *proc) metrics {
	t.Helper()
	m, err := scrapeMetrics(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// value sums the series of name whose labels include every pair of want
// (nil: every series); found is false when no series matches, so that a
// renamed metric or label fails a check instead of reading as 0.
func (m metrics) value(name string, want map[string]string) (v float64, found bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if !hasLabels(s, want) {
			continue
		}
		found = true
		switch {
		case s.Counter != nil:
			v += s.Counter.GetValue()
		case s.Gauge != nil:
			v += s.Gauge.GetValue()
		case s.Untyped != nil:
			v += s.Untyped.GetValue()
		}
	}
	return v, found
}

// observations is the number of observations of the histogram name over its
// series whose labels include every pair of want; found as for value.
func (m metrics) observations(name string, want map[string]string) (n uint64, found bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if s.Histogram == nil || !hasLabels(s, want) {
			continue
		}
		found = true
		n += s.Histogram.GetSampleCount()
	}
	return n, found
}

// require is value failing the test when no series of name has the labels
// of want.
func (m metrics) require(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	v, found := m.value(name, want)
	if !found {
		t.Fatalf("no series of %s with %v in /metrics (the metric or its labels changed?): %s", name, want, m.describe(name))
	}
	return v
}

// sum adds up every series of name.
func (m metrics) sum(name string) float64 {
	v, _ := m.value(name, nil)
	return v
}

func hasLabels(s *dto.Metric, want map[string]string) bool {
	have := make(map[string]string, len(s.GetLabel()))
	for _, l := range s.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// describe renders a metric's series, e.g. `{label="platform",
// path="root.output", reason="lease"} 3, ...`, or "none" when it has none.
func (m metrics) describe(name string) string {
	f := m[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return "none"
	}
	var parts []string
	for _, s := range f.GetMetric() {
		var labels []string
		for _, l := range s.GetLabel() {
			labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		v, _ := metrics{name: &dto.MetricFamily{Metric: []*dto.Metric{s}}}.value(name, nil)
		parts = append(parts, fmt.Sprintf("{%s} %v", strings.Join(labels, ","), v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
