package outboxretry

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Input, Name: "outbox_retry", Spec: outboxRetrySpec(), Base: "dsn: postgres://localhost/forwarder\n",
		Build: func(conf *service.ParsedConfig) error {
			_, err := newOutboxRetryFromParsed(conf, service.MockResources())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "BatchSizeZero", YAML: "batch_size: 0", Want: "field batch_size: 0 must be at least 1"},
		{Name: "BatchSizeOne", YAML: "batch_size: 1"},
		{Name: "LeaseBelowASecond", YAML: "lease: 999ms", Want: "field lease: 999ms must be at least 1s (CLAIM_LEASE)"},
		{Name: "LeaseNotADuration", YAML: "lease: 60", Want: `failed to parse 'lease' as a duration string: time: missing unit in duration "60"`},
		{Name: "LeaseASecond", YAML: "lease: 1s"},
		{Name: "LeaseFromAVariable", YAML: "lease: ${LINT_TEST_LEASE:500ms}", Want: "field lease: 500ms must be at least 1s"},
		{Name: "LeaseFromAVariableSet", YAML: "lease: ${LINT_TEST_LEASE:500ms}", Env: map[string]string{"LINT_TEST_LEASE": "2s"}},
		{Name: "PollIntervalZero", YAML: "poll_interval: 0s", Want: "field poll_interval: 0s must be positive"},
		{Name: "PollIntervalANanosecond", YAML: "poll_interval: 1ns"},
		{Name: "MaxUnackedZero", YAML: "max_unacked: 0", Want: "field max_unacked: 0 must be at least 1"},
		{Name: "MaxUnackedOne", YAML: "max_unacked: 1"},
		{Name: "MaxUnackedDirectNegative", YAML: "max_unacked_direct: -1", Want: "field max_unacked_direct: -1 must not be negative"},
		{Name: "MaxUnackedDirectZero", YAML: "max_unacked_direct: 0"},
		{Name: "MaxUnackedBytesNotASize", YAML: "max_unacked_bytes: lots", Want: `field max_unacked_bytes: "lots" is not a byte size such as 64MiB`},
		{Name: "MaxUnackedBytesAbove4EiB", YAML: "max_unacked_bytes: 5EiB", Want: `field max_unacked_bytes: "5EiB" is more than 4EiB`},
		{Name: "MaxUnackedBytes4EiB", YAML: "max_unacked_bytes: 4EiB"},
		{Name: "MaxUnackedBytesZero", YAML: "max_unacked_bytes: 0"},
		{Name: "MaxAttemptsZero", YAML: "max_attempts: 0", Want: "field max_attempts: 0 must be from 1 to 2147483647"},
		{Name: "MaxAttemptsBeyondTheColumn", YAML: "max_attempts: 2147483648", Want: "field max_attempts: 2147483648 must be from 1 to 2147483647"},
		{Name: "MaxAttemptsOne", YAML: "max_attempts: 1"},
		{Name: "MaxAttemptsLargest", YAML: "max_attempts: 2147483647"},
		{Name: "NackDelayNegative", YAML: "nack_delay: -1ns", Want: "field nack_delay: -1ns must not be negative"},
		{Name: "NackDelayZero", YAML: "nack_delay: 0s"},
		{Name: "RequeueAfterNegative", YAML: "failed_requeue:\n  after: -1s", Want: "field failed_requeue: after (-1s) and rounds (3) must not be negative"},
		{Name: "RequeueRoundsNegative", YAML: "failed_requeue:\n  rounds: -1", Want: "field failed_requeue: after (1h0m0s) and rounds (-1) must not be negative"},
		{Name: "RequeueRoundsBeyondTheColumn", YAML: "failed_requeue:\n  rounds: 2147483648", Want: "field failed_requeue.rounds: 2147483648 is more than 2147483647"},
		{Name: "RequeueBoundaries", YAML: "failed_requeue:\n  after: 0s\n  rounds: 2147483647"},
		{Name: "RequeueAfterNotADuration", YAML: "failed_requeue:\n  after: 1 hour", Want: "failed to parse 'failed_requeue.after' as a duration string"},
		{Name: "OrderOnFailedCase", YAML: "order_on_failed: Block", Want: `field order_on_failed (ORDER_ON_FAILED in the shipped pipeline): "Block" is not skip or block`},
		{Name: "OrderOnFailedUnknown", YAML: "order_on_failed: first", Want: `field order_on_failed (ORDER_ON_FAILED in the shipped pipeline): "first" is not skip or block`},
		{Name: "OrderOnFailedEmpty", YAML: `order_on_failed: ""`},
		{Name: "OrderOnFailedBlock", YAML: "order_on_failed: block"},
		{Name: "PartitionWidthNotHours", YAML: "partition_width: 90m", Want: "field partition_width (OUTBOX_PARTITION in the shipped pipeline)"},
		{Name: "PartitionWidthAboveAWeek", YAML: "partition_width: 8d", Want: "field partition_width (OUTBOX_PARTITION in the shipped pipeline)"},
		{Name: "PartitionWidthAnHour", YAML: "partition_width: 1h"},
		{Name: "PartitionWidthAWeek", YAML: "partition_width: 7d"},
		{Name: "RetentionBelowADay", YAML: "retention:\n  older_than: 23h", Want: "field retention.older_than: 23h is below the safe minimum of 1d"},
		{Name: "RetentionADay", YAML: "retention:\n  older_than: 1d"},
		{Name: "RetentionBelowADayForced", YAML: "retention:\n  older_than: 1h\n  force: true"},
		{Name: "RetentionNotADuration", YAML: "retention:\n  older_than: a week", Want: "field retention.older_than: "},
		{Name: "RetentionIntervalZero", YAML: "retention:\n  older_than: 7d\n  interval: 0s", Want: `field retention.interval: "0s" must be positive`},
		{Name: "RetentionIntervalIgnoredWhenOff", YAML: "retention:\n  interval: 0s"},
		{Name: "RetentionFromAnUnsetVariable", YAML: "retention:\n  older_than: ${LINT_TEST_RETENTION:}"},
	})
}
