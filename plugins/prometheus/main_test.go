package prometheus

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newTestExporter builds the exporter from a YAML config, closed at the end
// of the test.
func newTestExporter(t *testing.T, yaml string, log *service.Logger) *promExporter {
	t.Helper()
	conf, err := prometheusSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatalf("parsing config: %v", err)
	}
	m, err := newPromExporterFromParsed(conf, log)
	if err != nil {
		t.Fatalf("building exporter: %v", err)
	}
	e := m.(*promExporter)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

// scrapeHandler GETs /metrics from the exporter's handler and parses it.
func scrapeHandler(t *testing.T, e *promExporter) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	e.HandlerFunc()(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	return parseText(t, rec.Body)
}

// scrapeURL GETs a /metrics URL and parses it; ok is false when the server
// does not answer (yet).
func scrapeURL(t *testing.T, url string) (map[string]*dto.MetricFamily, bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	return parseText(t, resp.Body), true
}

func parseText(t *testing.T, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parsing the text format: %v", err)
	}
	return fams
}

// metricWith returns the series of family name whose labels include want.
func metricWith(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// logBuffer captures a Benthos logger's output for assertions.
type logBuffer struct{ logbuf.Buffer }

// count is the number of lines at level that contain substr.
func (l *logBuffer) count(level, substr string) int {
	n := 0
	for _, line := range l.Lines() {
		if strings.Contains(line, "level="+level) && strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func newTestLogger() (*service.Logger, *logBuffer) {
	lb := &logBuffer{}
	h := slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})
	return service.NewLoggerFromSlog(slog.New(h)), lb
}
