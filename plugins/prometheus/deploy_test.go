package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"
)

// The deployment files live at the repository root, two levels up.
var (
	dashboardPath  = filepath.Join("..", "..", "deploy", "grafana", "forwarder-dashboard.json")
	alertsPath     = filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml")
	alertTestsPath = filepath.Join("..", "..", "deploy", "prometheus", "alerts_test.yml")
	componentsPath = filepath.Join("..", "..", "docs", "components.md")
)

// promtool is Prometheus's own checker (Debian package prometheus; the CI
// script installs it). The tests fail without it rather than skip.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (apt-get install prometheus): %v", err)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// Numbers and durations (5m, 1e3, 0.99) are matched whole, then skipped.
	promqlIdent    = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlKeywords = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true,
	}
	durationLiteral = regexp.MustCompile(`^\d`)
)

// promqlMetricNames lists the metric names an expression reads: identifiers
// that are not functions, aggregations, keywords, label names or literals.
func promqlMetricNames(expr string) []string {
	expr = promqlStrings.ReplaceAllString(expr, `""`)
	expr = promqlMatchers.ReplaceAllString(expr, " ")
	expr = promqlGrouping.ReplaceAllString(expr, " ")
	var names []string
	for _, m := range promqlIdent.FindAllStringSubmatch(expr, -1) {
		id := m[0]
		if m[1] != "" || promqlKeywords[strings.ToLower(id)] || durationLiteral.MatchString(id) {
			continue
		}
		names = append(names, id)
	}
	return names
}

func TestPromQLMetricNames(t *testing.T) {
	t.Parallel()
	got := promqlMetricNames(`histogram_quantile(0.9, sum by (le) (rate(forwarder_forward_latency_seconds_bucket{job=~"$job", le!="x y"}[5m])))
		/ on (job) group_left (instance) max without (pod) (up offset 5m) > bool 3 and input_received`)
	want := []string{"forwarder_forward_latency_seconds_bucket", "up", "input_received"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// exportedMetricNames is every series name a query may use: the names of
// docs/components.md (with _bucket, _sum and _count for the _seconds
// histograms), those of this exporter, and Benthos's own as a running
// stream exports them through this exporter.
func exportedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	add := func(name string, kind dto.MetricType) {
		names[name] = true
		switch kind {
		case dto.MetricType_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name+"_sum"], names[name+"_count"] = true, true
		}
	}

	doc, err := os.ReadFile(componentsPath)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Metrics")
	if !ok {
		t.Fatalf("%s has no Metrics section", componentsPath)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	backticked := regexp.MustCompile("`([a-z_:]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		prefix := ""
		for _, m := range backticked.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if strings.HasPrefix(name, "_") { // `forwarder_records_pending`, `_in_progress`
				name = prefix + name
			} else {
				prefix = name[:strings.LastIndex(name, "_")]
			}
			kind := dto.MetricType_GAUGE
			if strings.HasSuffix(name, secondsSuffix) && !strings.HasPrefix(name, "forwarder_oldest") {
				kind = dto.MetricType_HISTOGRAM
			}
			add(name, kind)
		}
	}
	for _, n := range []string{"forwarder_records_pending", "forwarder_forward_latency_seconds_bucket", "forwarder_claim_batch_size"} {
		if !names[n] {
			t.Fatalf("reading %s: %s missing; got %v", componentsPath, n, keys(names))
		}
	}
	for _, n := range []string{metricRecordsPending, metricRecordsInProgress, metricRecordsSuccess, metricRecordsFailed, metricOldestPendingAge, metricGaugesLastRefresh} {
		add(n, dto.MetricType_GAUGE)
	}

	for name, f := range benthosMetricFamilies(t) {
		add(name, f.GetType())
	}
	return names
}

// benthosMetricFamilies scrapes a running stream (input, processor and
// output) through this exporter.
func benthosMetricFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	sb := service.NewEnvironment().NewStreamBuilder()
	sb.SetHTTPMux(mux)
	if err := sb.SetYAML(`
input:
  label: in
  generate:
    interval: 1ms
    mapping: 'root = {}'
pipeline:
  processors:
    - mapping: 'root = this'
output:
  label: out
  drop: {}
metrics:
  prometheus: {}
logger:
  level: none
`); err != nil {
		t.Fatal(err)
	}
	strm, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- strm.Run(context.Background()) }()
	defer func() {
		_ = strm.StopWithin(10 * time.Second)
		<-done
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fams, ok := scrapeURL(t, srv.URL+"/metrics"); ok && metricWith(fams, "output_sent", nil).GetCounter().GetValue() > 0 {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream never sent a message")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// grafanaVars stand in for Grafana's variables so that Prometheus can parse
// the expressions: intervals become durations, the others match anything
// (they are only used in regex matchers).
var grafanaVars = regexp.MustCompile(`\$\{?(\w+)\}?`)

func substituteGrafanaVars(expr string) string {
	return grafanaVars.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "__") {
			return "5m"
		}
		return ".*"
	})
}

type grafanaPanel struct {
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	Panels  []grafanaPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string         `json:"title"`
		UID        string         `json:"uid"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s does not parse: %v", dashboardPath, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard without title or uid")
	}

	// Every query, by where it comes from.
	queries := map[string]string{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for i, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %d has no expression", p.Title, i)
				}
				queries[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: unexpected query %q", v.Name, v.Definition)
			continue
		}
		queries["variable "+v.Name] = m[1]
	}
	if len(queries) < 10 {
		t.Fatalf("only %d queries found in the dashboard", len(queries))
	}

	// Panels the issue asks for, by the metric they must show.
	var all strings.Builder
	for _, q := range queries {
		all.WriteString(q + "\n")
	}
	for _, need := range []string{"forwarder_records_pending", "forwarder_records_failed", "forwarder_oldest_pending_age_seconds",
		"forwarder_attempts_total", "forwarder_forward_latency_seconds_bucket", "forwarder_end_to_end_latency_seconds_bucket",
		"forwarder_semaphore_available_permits", "input_received", "output_sent"} {
		if !strings.Contains(all.String(), need) {
			t.Errorf("no panel shows %s", need)
		}
	}

	exported := exportedMetricNames(t)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	i := 0
	for where, q := range queries {
		for _, name := range promqlMetricNames(q) {
			if !exported[name] {
				t.Errorf("%s reads %s, which nothing exports: %s", where, name, q)
			}
		}
		expr, _ := json.Marshal(substituteGrafanaVars(q)) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %s\n", i, expr)
		i++
	}
	// Prometheus's own parser checks the syntax of every query.
	file := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", file)
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	out := promtool(t, "check", "rules", alertsPath)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %s", out)
	}
	promtool(t, "test", "rules", alertTestsPath)

	raw, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	exported := exportedMetricNames(t)
	exported["up"] = true // synthesised by Prometheus for every scrape target
	var alerts []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, name := range promqlMetricNames(r.Expr) {
				if !exported[name] {
					t.Errorf("alert %s reads %s, which nothing exports", r.Alert, name)
				}
			}
		}
	}
	for _, need := range []string{"ForwarderFailedRowsIncreasing", "ForwarderBacklogGrowing", "ForwarderOldestPendingTooOld", "ForwarderInstanceDown", "ForwarderOrderingKeyBlocked"} {
		if !slices.Contains(alerts, need) {
			t.Errorf("alert %s missing; have %v", need, alerts)
		}
	}
}
