package kafka

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestInputLintRefusesWhatStartUpRefuses: each value start-up refuses,
// `forwarder lint` refuses with the same words; the boundary values both
// accept.
func TestInputLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Input, Name: "kafka_franz", Spec: franzInputSpec(),
		Base: "seed_brokers: [ localhost:9092 ]\ntopics: [ device-heartbeat ]\nconsumer_group: forwarder\n",
		Build: func(conf *service.ParsedConfig) error {
			_, err := newFranzInputFromParsed(conf, service.MockResources())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "CheckpointLimitZero", YAML: "checkpoint_limit: 0", Want: "field checkpoint_limit: must be at least 1, got 0"},
		{Name: "CheckpointLimitOne", YAML: "checkpoint_limit: 1"},
		{Name: "AutoReplayNacksFalse", YAML: "auto_replay_nacks: false", Want: "field auto_replay_nacks: false would drop rejected messages; kafka_franz always delivers them again, so remove the field or set it to true"},
		{Name: "AutoReplayNacksTrue", YAML: "auto_replay_nacks: true"},
		{Name: "MaxBufferedBytesZero", YAML: "max_buffered_bytes: 0B", Want: `field max_buffered_bytes: "0B" must be between 1B and 4EiB`},
		{Name: "MaxBufferedBytesNotASize", YAML: "max_buffered_bytes: much", Want: `field max_buffered_bytes: "much" is not a byte size such as 64MiB`},
		{Name: "MaxBufferedBytesBounds", YAML: "max_buffered_bytes: 4EiB"},
		{Name: "MaxBufferedBytesOne", YAML: "max_buffered_bytes: 1B"},
		{Name: "MaxMessageBytesAboveInt32", YAML: "max_message_bytes: 2GiB", Want: `field max_message_bytes: "2GiB" must be between 1B and 2147483647B`},
		{Name: "MaxMessageBytesLargest", YAML: "max_message_bytes: 2147483647"},
		{Name: "CommitPeriodZero", YAML: "commit_period: 0s", Want: "field commit_period: must be positive, got 0s"},
		{Name: "CommitPeriodANanosecond", YAML: "commit_period: 1ns"},
		{Name: "FetchMaxBytesAboveAGiB", YAML: "fetch_max_bytes: 1073741825", Want: `field fetch_max_bytes: "1073741825" must be between 1B and 1GiB`},
		{Name: "FetchMaxPartitionBytesZero", YAML: "fetch_max_partition_bytes: 0", Want: `field fetch_max_partition_bytes: "0" must be between 1B and 1GiB`},
		{Name: "FetchBytesBounds", YAML: "fetch_max_bytes: 1GiB\nfetch_max_partition_bytes: 1B\nfetch_min_bytes: 2147483647"},
		{Name: "FetchMinBytesZero", YAML: "fetch_min_bytes: 0B", Want: `field fetch_min_bytes: "0B" must be between 1B and 2147483647B`},
		{Name: "FetchMaxWaitBelow10ms", YAML: "fetch_max_wait: 9ms", Want: "field fetch_max_wait: 9ms is below 10ms, the least franz-go accepts"},
		{Name: "FetchMaxWaitAboveTheWire", YAML: "fetch_max_wait: 596h31m23.648s", Want: "field fetch_max_wait: 596h31m23.648s is above 596h31m23.647s"},
		{Name: "FetchMaxWaitBounds", YAML: "fetch_max_wait: 10ms"},
		{Name: "FetchMaxWaitLargest", YAML: "fetch_max_wait: 596h31m23.647s"},
		{Name: "SessionTooShort", YAML: "session_timeout: 99ms\nheartbeat_interval: 10ms", Want: "field session_timeout: 99ms is not from 100ms to 596h31m23.647s"},
		{Name: "SessionShortest", YAML: "session_timeout: 100ms\nheartbeat_interval: 99ms"},
		{Name: "RebalanceTooLong", YAML: "rebalance_timeout: 597h", Want: "field rebalance_timeout: 597h0m0s is not from 100ms to 596h31m23.647s"},
		{Name: "RebalanceLongest", YAML: "rebalance_timeout: 596h31m23.647s"},
		{Name: "HeartbeatNotBelowSession", YAML: "heartbeat_interval: 10s", Want: "field heartbeat_interval: 10s must be positive and lower than session_timeout (10s)"},
		{Name: "HeartbeatZero", YAML: "heartbeat_interval: 0s", Want: "field heartbeat_interval: 0s must be positive and lower than session_timeout (10s)"},
		{Name: "HeartbeatNotADuration", YAML: "heartbeat_interval: 3", Want: "failed to parse 'heartbeat_interval' as a duration string"},
		{Name: "HeartbeatJustBelowSession", YAML: "heartbeat_interval: 9999ms"},
		{Name: "MetadataTooYoung", YAML: "metadata_max_age: 4s", Want: "field metadata_max_age: 4s is not from 5s to 1h0m0s"},
		{Name: "MetadataTooOld", YAML: "metadata_max_age: 61m", Want: "field metadata_max_age: 1h1m0s is not from 5s to 1h0m0s"},
		{Name: "MetadataBounds", YAML: "metadata_max_age: 5s"},
		{Name: "MetadataOldest", YAML: "metadata_max_age: 1h"},
		{Name: "ConsumerGroupBlank", YAML: "consumer_group: ' '", Want: "field consumer_group: a consumer group is required"},
		{Name: "TopicsOnlyCommas", YAML: "topics: [ ',' ]", Want: "field topics: at least one topic is required"},
		{Name: "TopicsEmpty", YAML: "topics: []", Want: "field topics: at least one topic is required"},
		{Name: "TopicsFromAVariable", YAML: "topics: [ '${LINT_TEST_TOPICS:a,b}' ]"},
		{Name: "SASLMechanismCase", YAML: "sasl:\n  - mechanism: plain\n    username: u\n    password: p", Want: `field sasl[0].mechanism: unsupported mechanism "plain"`},
		{Name: "SASLNoneCase", YAML: "sasl:\n  - mechanism: None", Want: `field sasl[0].mechanism: unsupported mechanism "None"`},
		{Name: "SASLMechanism", YAML: "sasl:\n  - mechanism: none\n  - mechanism: PLAIN\n    username: u\n    password: p"},
	})
}

// TestOutputLintRefusesWhatStartUpRefuses: as for the input.
func TestOutputLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Output, Name: "kafka_franz", Spec: franzOutputSpec(), Base: "seed_brokers: [ localhost:9092 ]\ntopic: dead-letter\n",
		Build: func(conf *service.ParsedConfig) error {
			if _, _, err := parseOutputFlow(conf); err != nil {
				return err
			}
			_, err := newFranzOutputFromParsed(conf, service.MockResources())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "MaxInFlightZero", YAML: "max_in_flight: 0", Want: "field max_in_flight: must be from 1 to 10000, got 0: Benthos starts a goroutine for each"},
		{Name: "MaxInFlightAboveTheBound", YAML: "max_in_flight: 10001", Want: "field max_in_flight: must be from 1 to 10000, got 10001"},
		{Name: "MaxInFlightBounds", YAML: "max_in_flight: 1"},
		{Name: "MaxInFlightLargest", YAML: "max_in_flight: 10000"},
		{Name: "MaxMessageBytesBelowABatch", YAML: "max_message_bytes: 511B", Want: "field max_message_bytes: 511B is below 512B, the smallest record batch franz-go builds"},
		{Name: "MaxMessageBytesAboveAGiB", YAML: "max_message_bytes: 2GiB", Want: `field max_message_bytes: "2GiB" must be between 1B and 1GiB`},
		{Name: "MaxMessageBytesSmallest", YAML: "max_message_bytes: 512B"},
		{Name: "MaxMessageBytesLargest", YAML: "max_message_bytes: 1GiB"},
		{Name: "TimeoutZero", YAML: "timeout: 0s", Want: "field timeout: must be positive, got 0s"},
		{Name: "TimeoutANanosecond", YAML: "timeout: 1ns"},
		{Name: "CompressionCase", YAML: "compression: ZSTD", Want: `field compression: unknown codec "ZSTD"`},
		{Name: "CompressionUnknown", YAML: "compression: brotli", Want: `field compression: unknown codec "brotli"`},
		{Name: "Compression", YAML: "compression: zstd"},
		{Name: "SeedBrokersOnlyCommas", YAML: "seed_brokers: [ ', ' ]", Want: "field seed_brokers: at least one broker address is required"},
		{Name: "MetadataTooYoung", YAML: "metadata_max_age: 1s", Want: "field metadata_max_age: 1s is not from 5s to 1h0m0s"},
	})
}
