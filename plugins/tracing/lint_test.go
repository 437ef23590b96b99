package tracing

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Tracer, Name: "otlp", Spec: otlpSpec(),
		Build: func(conf *service.ParsedConfig) error {
			_, err := newOtlpFromParsed(conf, func(string) string { return "" }, conf.Resources().Logger())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "RatioNegative", YAML: "sampling_ratio: -0.1", Want: "sampling_ratio: -0.1 is outside 0 to 1"},
		{Name: "RatioAboveOne", YAML: "sampling_ratio: 1.01", Want: "sampling_ratio: 1.01 is outside 0 to 1"},
		{Name: "RatioNaN", YAML: "sampling_ratio: .nan", Want: "sampling_ratio: NaN is outside 0 to 1"},
		{Name: "RatioZero", YAML: "sampling_ratio: 0"},
		{Name: "RatioOne", YAML: "sampling_ratio: 1"},
		{Name: "RatioFromAVariable", YAML: "sampling_ratio: ${LINT_TEST_RATIO:2}", Want: "sampling_ratio: 2 is outside 0 to 1"},
		{Name: "RatioFromAVariableSet", YAML: "sampling_ratio: ${LINT_TEST_RATIO:2}", Env: map[string]string{"LINT_TEST_RATIO": "0.5"}},
	})
}
