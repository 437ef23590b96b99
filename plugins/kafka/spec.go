package kafka

import (
	"math"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	kfiFieldTopics                 = "topics"
	kfiFieldConsumerGroup          = "consumer_group"
	kfiFieldInstanceID             = "instance_id"
	kfiFieldCheckpointLimit        = "checkpoint_limit"
	kfiFieldMaxBufferedBytes       = "max_buffered_bytes"
	kfiFieldMaxMessageBytes        = "max_message_bytes"
	kfiFieldCommitPeriod           = "commit_period"
	kfiFieldStartFromOldest        = "start_from_oldest"
	kfiFieldFetchMaxBytes          = "fetch_max_bytes"
	kfiFieldFetchMaxPartitionBytes = "fetch_max_partition_bytes"
	kfiFieldFetchMinBytes          = "fetch_min_bytes"
	kfiFieldFetchMaxWait           = "fetch_max_wait"
	kfiFieldSessionTimeout         = "session_timeout"
	kfiFieldHeartbeatInterval      = "heartbeat_interval"
	kfiFieldRebalanceTimeout       = "rebalance_timeout"
	kfiFieldBatching               = "batching"
	kfiFieldAutoReplayNacks        = service.AutoRetryNacksToggleFieldName
)

var franzInputSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Services").
		Summary("Consumes Kafka topics as a member of a consumer group, committing an offset only once every message up to it has been acknowledged.").
		Description(`
Built on [franz-go](https://github.com/twmb/franz-go). The field names follow Redpanda Connect's `+"`kafka_franz`"+` input where the two overlap, so configs port over.

### Delivery guarantees

Delivery is at-least-once. A batch holds what has been read of every partition with room (consecutive records of each, at most `+"`checkpoint_limit`"+` records in all); a `+"`batching`"+` policy groups what the input hands out further. An offset is committed only when the record at it and every earlier record of its partition have been acknowledged (delivered by the output, or filtered out by a processor); acknowledgements may arrive in any order and are tracked per partition. Offsets are committed every `+"`commit_period`"+`, when partitions are revoked in a rebalance, and on shutdown. After a crash, or a stop that does not drain, the records after the last commit are read again: duplicates are possible, losses are not.

A rejected (nacked) batch is never skipped: it is delivered again, with a backoff, until it is acknowledged, and its offsets stay uncommitted meanwhile.

### Back-pressure and memory

At most `+"`checkpoint_limit`"+` records of a partition are in the pipeline without an acknowledgement, and up to as many more are read ahead. Across all partitions the input holds at most `+"`max_buffered_bytes`"+` of records (keys, values and headers), read ahead and in the pipeline together: once it holds that much it stops fetching, and it hands out nothing more until acknowledgements free room. A single record larger than `+"`max_buffered_bytes`"+` is still delivered, alone. One poll may bring the read-ahead over the budget by what franz-go had already fetched, and franz-go buffers at most one fetch response per broker (`+"`fetch_max_bytes`"+` each as sent, every record batch in it decompressed to at most four times `+"`max_message_bytes`"+`), so memory stays bounded whatever the output does.

### Group membership

A new consumer group starts at the oldest offset (`+"`start_from_oldest`"+`). On a clean shutdown the member leaves the group so its partitions move to the other members at once; a member that dies is replaced after `+"`session_timeout`"+`. With `+"`instance_id`"+` the member is static: a restart with the same id takes its partitions back without a rebalance.

If no broker is reachable at start, connecting waits and retries with backoff; an unreachable broker is logged once per outage, not once per attempt.

A topic deleted and created again under the same name is read again without a restart (franz-go alone would stop reading it): the input logs a warning, leaves the old topic's partitions without committing their offsets, and reads the new topic from its oldest record.

### Transactions

Records a producer writes in a transaction are read once the transaction commits, and never when it aborts (Kafka's `+"`read_committed`"+` isolation; franz-go and the Java client read them all by default): an event the producer rolled back is not delivered. A transaction left open holds its partitions back, from its first record, until it ends or the broker aborts it (`+"`transaction.max.timeout.ms`"+`, 15 minutes by default); `+"`forwarder_kafka_consumer_lag`"+` counts the records held back. Each transaction ends with a marker, an offset of its own that holds no message; the group's commit passes a marker once the records before it are acknowledged, as a Java consumer's does, so a partition whose last write ended a transaction (or an aborted transaction alone) is committed to its end and its lag is 0.

### Metadata

Each message carries:

- `+"`kafka_key`"+` (only when the record has a key)
- `+"`kafka_topic`"+`
- `+"`kafka_partition`"+`
- `+"`kafka_offset`"+`
- `+"`kafka_timestamp_ms`"+` (the record timestamp, Unix milliseconds)
- `+"`kafka_oversize`"+` (only on a message that stands for an oversized record or batch, see above)
- every record header, by its name (a header cannot override the keys above)

A tombstone (null value) or an empty value is delivered as a message with an empty body.

### Oversized records

A compressed record batch must be decompressed whole before any of its records can be read, and a batch of a few KiB can decompress to gigabytes. So no batch is decompressed past four times `+"`max_message_bytes`"+` (64 MiB by default): the input's decompressor stops at that bound, and the batch is not read at all. So is a batch it cannot decompress for another reason (a zstd window wider than the bound and than 8 MiB, the widest of zstd's standard levels; bytes that are not valid for their codec), which would otherwise be fetched again forever; the log says why. It is delivered as one message with an empty body and the metadata `+"`kafka_oversize`"+`, which says which offsets the batch spans and names the bound; its `+"`kafka_offset`"+` is the batch's first offset (it has no `+"`kafka_key`"+`, `+"`kafka_timestamp_ms`"+` or headers). Its acknowledgement commits the offset after the batch, and the partition goes on from there: the partition never stalls on it. Kafka's producers put a record larger than their batch size in a batch of its own, so such a batch holds one oversized record; a producer whose batches of ordinary records decompress past the bound (batches of several large messages) has them refused as a whole, accounted for by that one message, so keep producer batches under four times `+"`max_message_bytes`"+` before compression.

A record read from a batch within the bound whose value, or whose key and headers together, are larger than `+"`max_message_bytes`"+` is delivered the same way: an empty body, `+"`kafka_oversize`"+` naming its sizes, and its own `+"`kafka_offset`"+` and `+"`kafka_timestamp_ms`"+`. The `+"`outbox`"+` processor stores such messages FAILED with that reason and no payload.

### Metrics

`+"`"+metricConsumerLag+"{topic, partition}`"+`: for each partition this member consumes, the partition's high watermark minus the next offset the input will read, from every fetch (and from a ListOffsets request every `+"`commit_period`"+` while no records are fetched, so the gauge keeps up while the pipeline is stalled). A partition shows up once it has delivered a record; it drops to 0 when the partition moves to another member.

`+"`"+metricPartitionsAssigned+"{topic}`"+`: the partitions of each configured topic assigned to this member, 0 until the group assigns it some (and for a topic that does not exist). Summed over the instances, 0 for a topic means nothing reads it: a refused join, a missing topic, a stuck group.

`+"`"+metricRecordsExpired+"`"+`: records Kafka deleted before the group read them. When a partition is assigned, the group's committed offset is compared with the partition's log start; a commit below it means the topic's retention removed records the group never read (the forwarder was stopped, or behind, for longer than the retention). They cannot be read any more: each such partition is logged at ERROR with the offsets lost, they are counted here, and consuming resumes at the log start, whatever `+"`start_from_oldest`"+` says (it is for a group without a commit). Records deleted under a partition while it is being read (the retention overtook a consumer far behind) are logged and counted the same way: franz-go resumes at the log start, and the first record read after it gives the range lost. The count is of offsets: those a transactional producer's markers took, or that compaction had emptied, held no message, so on such topics it is an upper bound.`).
		Fields(
			seedBrokersField(),
			service.NewStringListField(kfiFieldTopics).
				Description("Topics to consume. Each entry may be a comma-separated list.").
				Example([]string{"device-vehicle-event", "device-heartbeat"}).
				LintRule(listLintRule(kfiFieldTopics, "topic")),
			service.NewStringField(kfiFieldConsumerGroup).
				Description("The consumer group whose offsets are committed. Every instance of the service uses the same group so partitions are shared between them.").
				Example("forwarder").
				LintRule(consumerGroupLintRule),
			clientIDField(),
			metadataMaxAgeField(),
			service.NewStringField(kfiFieldInstanceID).
				Description("Makes this member static (Kafka's `group.instance.id`): it must be unique within the group and stable across restarts. A restarted member with the same id gets its partitions back without a rebalance, provided it returns within `session_timeout`. Leave empty for dynamic membership.").
				Example("forwarder-0").
				Optional().
				Advanced(),
			service.NewIntField(kfiFieldCheckpointLimit).
				Description("The most records of one partition that may be in the pipeline at once without an acknowledgement (back-pressure; see above). Lower values mean fewer duplicates after a crash; higher values allow more parallelism per partition.").
				Default(1024).
				LintRule(fieldlint.Int(checkCheckpointLimit)),
			service.NewStringField(kfiFieldMaxBufferedBytes).
				Description("The most record bytes (keys, values and headers) the input holds at once, over all partitions: read ahead and in the pipeline without an acknowledgement. At the budget the input stops fetching and hands out nothing more until acknowledgements free room; a single larger record is still delivered, alone. With 16 MiB messages the default lets four be in the pipeline at once.").
				Default("64MiB").
				Example("256MiB").
				LintRule(bytesLintRule(kfiFieldMaxBufferedBytes, 1<<62, "between 1B and 4EiB")),
			service.NewStringField(kfiFieldMaxMessageBytes).
				Description("The largest record the input delivers: its value, and its key and headers together, may each be this large. A larger record is delivered as an empty message with the metadata `kafka_oversize`, and a compressed record batch that would decompress to more than four times this is never decompressed further (see Oversized records). Keep it equal to the `outbox` processor's `max_payload_bytes`.").
				Default("16MiB").
				Example("1MiB").
				LintRule(int32BytesLintRule(kfiFieldMaxMessageBytes)),
			service.NewDurationField(kfiFieldCommitPeriod).
				Description("How often acknowledged offsets are committed. Offsets are also committed when partitions are revoked and on shutdown.").
				Default("5s").
				LintRule(positiveLintRule(kfiFieldCommitPeriod)),
			service.NewBoolField(kfiFieldStartFromOldest).
				Description("Where a consumer group without a committed offset starts: the oldest available record (true) or only new records (false). Also applies when a committed offset is no longer available.").
				Default(true),
			service.NewStringField(kfiFieldFetchMaxBytes).
				Description("The most data one fetch request may return (Kafka's `fetch.max.bytes`), and so what franz-go buffers per broker until the input polls it. A record batch larger than this is still returned whole, so large messages are consumed anyway. The limit is on the compressed size: well-compressed data takes more memory once decompressed. At most `1GiB`, the largest response franz-go reads.").
				Default("16MiB").
				LintRule(brokerIOLintRule(kfiFieldFetchMaxBytes)).
				Advanced(),
			service.NewStringField(kfiFieldFetchMaxPartitionBytes).
				Description("The most data one fetch returns per partition (Kafka's `max.partition.fetch.bytes`). The first record batch of a partition is returned even when it is larger. At most `1GiB`.").
				Default("1MiB").
				LintRule(brokerIOLintRule(kfiFieldFetchMaxPartitionBytes)).
				Advanced(),
			service.NewStringField(kfiFieldFetchMinBytes).
				Description("The least data a broker gathers before it answers a fetch, waiting at most `fetch_max_wait` (Kafka's `fetch.min.bytes`). With `1B` a fetch returns as soon as one record is there, so at a steady rate each brings one or two; a larger value lets a fetch bring what arrived over `fetch_max_wait`, for less CPU on both sides and up to that much more latency. A backlog fills fetches at once either way.").
				Default("1B").
				LintRule(int32BytesLintRule(kfiFieldFetchMinBytes)).
				Advanced(),
			service.NewDurationField(kfiFieldFetchMaxWait).
				Description("How long a broker may hold a fetch while less than `fetch_min_bytes` is there (Kafka's `fetch.max.wait.ms`); also how often an idle consumer asks. At least 10ms, at most 596h31m23.647s (a fetch request carries it as a 32-bit count of milliseconds).").
				Default("5s").
				LintRule(fetchMaxWaitLintRule).
				Advanced(),
			service.NewDurationField(kfiFieldSessionTimeout).
				Description("How long the group waits for a silent member before giving its partitions to others (Kafka's `session.timeout.ms`; the broker allows 6s to 5m by default). Kept short so a crashed instance's partitions are consumed again within seconds. From 100ms to 596h31m23.647s, what franz-go accepts.").
				Default("10s").
				LintRule(groupTimeoutLintRule(kfiFieldSessionTimeout)).
				Advanced(),
			service.NewDurationField(kfiFieldHeartbeatInterval).
				Description("How often the member heartbeats to the group coordinator; must be lower than `session_timeout` (a third of it is usual).").
				Default("3s").
				LintRule(fieldlint.Duration(kfiFieldHeartbeatInterval, func(time.Duration) error { return nil })).
				Advanced(),
			service.NewDurationField(kfiFieldRebalanceTimeout).
				Description("How long the group waits for members to rejoin during a rebalance (Kafka's `rebalance.timeout.ms`). An offset commit gives up after a third of it, so a commit the broker does not answer cannot keep this member in a rebalance past it: the commit on revoke is then abandoned and the next owner reads from the previous commit. From 100ms to 596h31m23.647s.").
				Default("45s").
				LintRule(groupTimeoutLintRule(kfiFieldRebalanceTimeout)).
				Advanced(),
			tlsField(),
			saslField(),
			service.NewBatchPolicyField(kfiFieldBatching).
				Description("Groups what the input hands out into batches by this policy before they enter the pipeline; its processors run on each batch. Without a policy, a batch holds what has been read of every partition, up to `checkpoint_limit` records; `count: 1` gives one record per batch, and `period: 0s` alone hands each batch on at once. A batch is flushed early when a partition in it reaches `checkpoint_limit` or the input reaches `max_buffered_bytes`, since nothing more can join it until it is acknowledged. Unlike Redpanda Connect's, batches may hold records of several partitions (each partition's records in order). If the batching processors fail, Benthos drops the batch's messages and they count as delivered: keep those processors simple."),
			service.NewBoolField(kfiFieldAutoReplayNacks).
				Description("Accepted for configs from Redpanda Connect. A rejected batch is always delivered again until it is acknowledged, so only `true` is allowed: `false` would drop rejected messages.").
				Default(true).
				LintRule(fieldlint.Bool(checkAutoReplayNacks)).
				Advanced(),
		).
		LintRule(heartbeatLintRule).
		Example("Ingest", "Consume two topics in a shared group, committing every 5 seconds.", `
input:
  kafka_franz:
    seed_brokers: [ "${KAFKA_BROKERS:localhost:9092}" ]
    topics: [ "device-vehicle-event", "device-heartbeat" ]
    consumer_group: "${KAFKA_GROUP:forwarder}"
    checkpoint_limit: 1024
    max_buffered_bytes: 64MiB
    commit_period: 5s
    start_from_oldest: true
`).
		Example("Secured cluster", "TLS with SCRAM authentication and static membership.", `
input:
  kafka_franz:
    seed_brokers: [ "kafka-1:9093,kafka-2:9093" ]
    topics: [ "device-vehicle-event" ]
    consumer_group: forwarder
    instance_id: "${HOSTNAME}"
    tls:
      enabled: true
    sasl:
      - mechanism: SCRAM-SHA-512
        username: forwarder
        password: "${KAFKA_PASSWORD}"
`)
})

func init() {
	service.MustRegisterBatchInput("kafka_franz", franzInputSpec(),
		func(conf *service.ParsedConfig, res *service.Resources) (service.BatchInput, error) {
			in, err := newFranzInputFromParsed(conf, res)
			if err != nil {
				return nil, err
			}
			// Benthos's own replay of rejected batches: the input's ack
			// function is called only once a batch is delivered.
			return service.AutoRetryNacksBatched(in), nil
		})
}

// checkCheckpointLimit is the check of checkpoint_limit, which start-up runs
// on the parsed value and lint (fieldlint) on the value written.
var checkCheckpointLimit = fieldlint.Range(1, math.MaxInt, "field "+kfiFieldCheckpointLimit+": must be at least 1, got %d")
