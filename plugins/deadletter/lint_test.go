package deadletter

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Input, Name: "outbox_dead_letter", Spec: deadLetterSpec(),
		Build: func(conf *service.ParsedConfig) error {
			_, err := newDeadLetterFromParsed(conf, service.MockResources())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "BatchSizeZero", YAML: "batch_size: 0", Want: "field batch_size: 0 must be at least 1"},
		{Name: "BatchSizeOne", YAML: "batch_size: 1"},
		{Name: "PollIntervalZero", YAML: "poll_interval: 0s", Want: "field poll_interval: 0s must be positive (DEAD_LETTER_POLL_INTERVAL)"},
		{Name: "PollIntervalNotADuration", YAML: "poll_interval: 5", Want: "failed to parse 'poll_interval' as a duration string"},
		{Name: "PollIntervalANanosecond", YAML: "poll_interval: 1ns"},
		{Name: "PollIntervalFromAVariable", YAML: "poll_interval: ${LINT_TEST_POLL:0s}", Want: "field poll_interval: 0s must be positive"},
		{Name: "LeaseBelowASecond", YAML: "lease: 999ms", Want: "field lease: 999ms must be at least 1s"},
		{Name: "LeaseASecond", YAML: "lease: 1s"},
	})
}
