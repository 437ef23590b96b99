package prometheus

import (
	"context"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Metrics, Name: "prometheus", Spec: prometheusSpec(),
		Build: func(conf *service.ParsedConfig) error {
			e, err := newPromExporterFromParsed(conf, nil)
			if err != nil {
				return err
			}
			// Built with an outbox, it refreshes its gauges until closed.
			return e.Close(context.Background())
		}}.Run(t, []linttest.Case{
		{Name: "BucketsNotIncreasing", YAML: "histogram_buckets: [ 1, 0.5 ]", Want: "histogram_buckets must be in increasing order, got [1 0.5]"},
		{Name: "BucketsIncreasing", YAML: "histogram_buckets: [ 0.5, 1, 1 ]"},
		{Name: "QuantileZero", YAML: "summary_quantiles_objectives:\n  - { quantile: 0, error: 0.1 }", Want: "summary_quantiles_objectives[0]: quantile must be in (0, 1] and error in [0, 1), got 0 and 0.1"},
		{Name: "ErrorOne", YAML: "summary_quantiles_objectives:\n  - { quantile: 0.5, error: 0.05 }\n  - { quantile: 1, error: 1 }", Want: "summary_quantiles_objectives[1]: quantile must be in (0, 1] and error in [0, 1), got 1 and 1"},
		{Name: "QuantileNaN", YAML: "summary_quantiles_objectives:\n  - { quantile: .nan, error: 0.1 }", Want: "summary_quantiles_objectives[0]: quantile must be in (0, 1] and error in [0, 1), got NaN and 0.1"},
		{Name: "ObjectivesBounds", YAML: "summary_quantiles_objectives:\n  - { quantile: 1, error: 0 }\n  - { quantile: 0.000001, error: 0.999999 }"},
		{Name: "RefreshZero", YAML: "outbox:\n  dsn: postgres://localhost/forwarder\n  refresh_interval: 0s", Want: "outbox.refresh_interval must be positive, got 0s"},
		{Name: "RefreshANanosecond", YAML: "outbox:\n  dsn: postgres://localhost/forwarder\n  refresh_interval: 1ns"},
	})
}
