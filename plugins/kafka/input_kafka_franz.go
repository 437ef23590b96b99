package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/internal/shutdownlog"
	"github.com/forwarder/forwarder/internal/tracectx"
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
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
	kfiFieldSessionTimeout         = "session_timeout"
	kfiFieldHeartbeatInterval      = "heartbeat_interval"
	kfiFieldRebalanceTimeout       = "rebalance_timeout"
	kfiFieldBatching               = "batching"
	kfiFieldAutoReplayNacks        = service.AutoRetryNacksToggleFieldName
)

// metricConsumerLag is the per-partition lag gauge (docs/components.md).
const metricConsumerLag = "forwarder_kafka_consumer_lag"

// batchBytesPerMessage is how many times max_message_bytes a compressed
// record batch may decompress to. Producers put a record larger than their
// batch size in a batch of its own, so a batch past this holds a record far
// past max_message_bytes; the room above one message is for producers that
// batch several large messages together (docs/guarantees.md #17).
const batchBytesPerMessage = 4

func franzInputSpec() *service.ConfigSpec {
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

`+"`"+metricConsumerLag+"{topic, partition}`"+`: for each partition this member consumes, the partition's high watermark minus the next offset the input will read, from every fetch (and from a ListOffsets request every `+"`commit_period`"+` while no records are fetched, so the gauge keeps up while the pipeline is stalled). A partition shows up once it has delivered a record; it drops to 0 when the partition moves to another member.`).
		Fields(
			seedBrokersField(),
			service.NewStringListField(kfiFieldTopics).
				Description("Topics to consume. Each entry may be a comma-separated list.").
				Example([]string{"device-vehicle-event", "device-heartbeat"}),
			service.NewStringField(kfiFieldConsumerGroup).
				Description("The consumer group whose offsets are committed. Every instance of the service uses the same group so partitions are shared between them.").
				Example("forwarder"),
			clientIDField(),
			service.NewStringField(kfiFieldInstanceID).
				Description("Makes this member static (Kafka's `group.instance.id`): it must be unique within the group and stable across restarts. A restarted member with the same id gets its partitions back without a rebalance, provided it returns within `session_timeout`. Leave empty for dynamic membership.").
				Example("forwarder-0").
				Optional().
				Advanced(),
			service.NewIntField(kfiFieldCheckpointLimit).
				Description("The most records of one partition that may be in the pipeline at once without an acknowledgement (back-pressure; see above). Lower values mean fewer duplicates after a crash; higher values allow more parallelism per partition.").
				Default(1024),
			service.NewStringField(kfiFieldMaxBufferedBytes).
				Description("The most record bytes (keys, values and headers) the input holds at once, over all partitions: read ahead and in the pipeline without an acknowledgement. At the budget the input stops fetching and hands out nothing more until acknowledgements free room; a single larger record is still delivered, alone. With 16 MiB messages the default lets four be in the pipeline at once.").
				Default("64MiB").
				Example("256MiB"),
			service.NewStringField(kfiFieldMaxMessageBytes).
				Description("The largest record the input delivers: its value, and its key and headers together, may each be this large. A larger record is delivered as an empty message with the metadata `kafka_oversize`, and a compressed record batch that would decompress to more than four times this is never decompressed further (see Oversized records). Keep it equal to the `outbox` processor's `max_payload_bytes`.").
				Default("16MiB").
				Example("1MiB"),
			service.NewDurationField(kfiFieldCommitPeriod).
				Description("How often acknowledged offsets are committed. Offsets are also committed when partitions are revoked and on shutdown.").
				Default("5s"),
			service.NewBoolField(kfiFieldStartFromOldest).
				Description("Where a consumer group without a committed offset starts: the oldest available record (true) or only new records (false). Also applies when a committed offset is no longer available.").
				Default(true),
			service.NewStringField(kfiFieldFetchMaxBytes).
				Description("The most data one fetch request may return (Kafka's `fetch.max.bytes`), and so what franz-go buffers per broker until the input polls it. A record batch larger than this is still returned whole, so large messages are consumed anyway. The limit is on the compressed size: well-compressed data takes more memory once decompressed.").
				Default("16MiB").
				Advanced(),
			service.NewStringField(kfiFieldFetchMaxPartitionBytes).
				Description("The most data one fetch returns per partition (Kafka's `max.partition.fetch.bytes`). The first record batch of a partition is returned even when it is larger.").
				Default("1MiB").
				Advanced(),
			service.NewDurationField(kfiFieldSessionTimeout).
				Description("How long the group waits for a silent member before giving its partitions to others (Kafka's `session.timeout.ms`; the broker allows 6s to 5m by default). Kept short so a crashed instance's partitions are consumed again within seconds.").
				Default("10s").
				Advanced(),
			service.NewDurationField(kfiFieldHeartbeatInterval).
				Description("How often the member heartbeats to the group coordinator; must be lower than `session_timeout` (a third of it is usual).").
				Default("3s").
				Advanced(),
			service.NewDurationField(kfiFieldRebalanceTimeout).
				Description("How long the group waits for members to rejoin during a rebalance (Kafka's `rebalance.timeout.ms`). An offset commit gives up after a third of it, so a commit the broker does not answer cannot keep this member in a rebalance past it: the commit on revoke is then abandoned and the next owner reads from the previous commit.").
				Default("45s").
				Advanced(),
			tlsField(),
			saslField(),
			service.NewBatchPolicyField(kfiFieldBatching).
				Description("Groups what the input hands out into batches by this policy before they enter the pipeline; its processors run on each batch. Without a policy, a batch holds what has been read of every partition, up to `checkpoint_limit` records; `count: 1` gives one record per batch. A batch is flushed early when a partition in it reaches `checkpoint_limit` or the input reaches `max_buffered_bytes`, since nothing more can join it until it is acknowledged. Unlike Redpanda Connect's, batches may hold records of several partitions (each partition's records in order). If the batching processors fail, Benthos drops the batch's messages and they count as delivered: keep those processors simple."),
			service.NewBoolField(kfiFieldAutoReplayNacks).
				Description("Accepted for configs from Redpanda Connect. A rejected batch is always delivered again until it is acknowledged, so only `true` is allowed: `false` would drop rejected messages.").
				Default(true).
				LintRule(`root = if this == false { [ "auto_replay_nacks: false would drop rejected messages; kafka_franz always delivers them again, so remove the field or set it to true" ] }`).
				Advanced(),
		).
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
}

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

// franzInput is the kafka_franz input. Several goroutines share its state
// under mu: the poll loop (fetches records, stops while the input holds
// what its limits allow), the reader (ReadBatch, hands out batches),
// whoever calls the ack functions, the commit loop and franz-go's rebalance
// callbacks. No network call is made with mu held.
type franzInput struct {
	log *service.Logger
	lag *service.MetricGauge
	// tracer starts each message's kafka.consume span; nil when the
	// stream does not trace.
	tracer trace.Tracer

	clientOpts       []kgo.Opt
	probeOpts        []kgo.Opt // connection options only: the client Connect waits with
	group            string
	checkpointLimit  int
	maxBufferedBytes int64
	maxMessageBytes  int64
	commitPeriod     time.Duration
	commitTimeout    time.Duration // a third of rebalance_timeout
	closeTimeout     time.Duration
	outage           *outageLogger

	mu             sync.Mutex
	client         *kgo.Client
	parts          map[topicPartition]*partitionState
	budget         *byteBudget
	polls          uint64             // polls that returned records, for the lag refresh
	cancelPeriodic context.CancelFunc // abandons the periodic commit in flight, if any
	notify         chan struct{}      // capacity 1: records are ready or room was freed
	room           chan struct{}      // capacity 1: pending records were taken or dropped
	runCancel      context.CancelFunc
	commits        *periodic.Loop // commits every commit_period while connected
	wg             sync.WaitGroup

	// readerMu is held by the reader while it uses batcher, and by Close
	// to close it once the reader is done.
	readerMu sync.Mutex
	batcher  *policyBatcher // nil without a batching policy

	// unacked counts the records handed to the pipeline whose ack has not
	// come yet; shutdown reports them while the engine waits for them.
	unacked  atomic.Int64
	shutdown *shutdownlog.Watch
}

func newFranzInputFromParsed(conf *service.ParsedConfig, res *service.Resources) (*franzInput, error) {
	opts, err := parseCommonOpts(conf)
	if err != nil {
		return nil, err
	}
	f := &franzInput{
		log:    res.Logger(),
		lag:    res.Metrics().NewGauge(metricConsumerLag, "topic", "partition"),
		tracer: tracectx.Tracer(res),
		parts:  make(map[topicPartition]*partitionState),
		notify: make(chan struct{}, 1),
		room:   make(chan struct{}, 1),
	}
	f.outage = newOutageLogger(f.log)
	f.shutdown = shutdownlog.New(f.log, shutdownlog.Interval, f.awaited)

	rawTopics, err := conf.FieldStringList(kfiFieldTopics)
	if err != nil {
		return nil, err
	}
	var topics []string
	for _, entry := range rawTopics {
		for _, t := range strings.Split(entry, ",") {
			if t = strings.TrimSpace(t); t != "" {
				topics = append(topics, t)
			}
		}
	}
	if len(topics) == 0 {
		return nil, fmt.Errorf("field %s: at least one topic is required", kfiFieldTopics)
	}

	if f.group, err = conf.FieldString(kfiFieldConsumerGroup); err != nil {
		return nil, err
	}
	if f.group = strings.TrimSpace(f.group); f.group == "" {
		return nil, fmt.Errorf("field %s: a consumer group is required: offsets are committed to it", kfiFieldConsumerGroup)
	}

	if f.checkpointLimit, err = conf.FieldInt(kfiFieldCheckpointLimit); err != nil {
		return nil, err
	}
	if f.checkpointLimit < 1 {
		return nil, fmt.Errorf("field %s: must be at least 1, got %d", kfiFieldCheckpointLimit, f.checkpointLimit)
	}
	if f.maxBufferedBytes, err = parseBudget(conf, kfiFieldMaxBufferedBytes); err != nil {
		return nil, err
	}
	maxMessage, err := parseByteSize(conf, kfiFieldMaxMessageBytes)
	if err != nil {
		return nil, err
	}
	f.maxMessageBytes = int64(maxMessage)
	if f.commitPeriod, err = conf.FieldDuration(kfiFieldCommitPeriod); err != nil {
		return nil, err
	}
	if f.commitPeriod <= 0 {
		return nil, fmt.Errorf("field %s: must be positive, got %s", kfiFieldCommitPeriod, f.commitPeriod)
	}

	oldest, err := conf.FieldBool(kfiFieldStartFromOldest)
	if err != nil {
		return nil, err
	}
	reset := kgo.NewOffset().AtEnd()
	if oldest {
		reset = kgo.NewOffset().AtStart()
	}

	fetchMax, err := parseByteSize(conf, kfiFieldFetchMaxBytes)
	if err != nil {
		return nil, err
	}
	fetchPartMax, err := parseByteSize(conf, kfiFieldFetchMaxPartitionBytes)
	if err != nil {
		return nil, err
	}
	// franz-go refuses responses above BrokerMaxReadBytes (100MiB by
	// default), which must leave room for a full fetch.
	readMax := int32(100 << 20)
	if 2*int64(fetchMax) > int64(readMax) {
		readMax = int32(min(2*int64(fetchMax), 1<<31-1))
	}

	session, err := conf.FieldDuration(kfiFieldSessionTimeout)
	if err != nil {
		return nil, err
	}
	heartbeat, err := conf.FieldDuration(kfiFieldHeartbeatInterval)
	if err != nil {
		return nil, err
	}
	rebalance, err := conf.FieldDuration(kfiFieldRebalanceTimeout)
	if err != nil {
		return nil, err
	}
	if heartbeat <= 0 || heartbeat >= session {
		return nil, fmt.Errorf("field %s: %s must be positive and lower than %s (%s)", kfiFieldHeartbeatInterval, heartbeat, kfiFieldSessionTimeout, session)
	}
	if rebalance <= 0 {
		return nil, fmt.Errorf("field %s: must be positive, got %s", kfiFieldRebalanceTimeout, rebalance)
	}
	// A commit in flight holds up this member's next join (franz-go does
	// not join while committing), and the commit on revoke holds up its
	// rejoin: a third of the rebalance timeout each leaves the member
	// time to rejoin before the group gives up on it.
	f.commitTimeout = rebalance / 3
	f.closeTimeout = max(session, 5*time.Second)

	policy, err := conf.FieldBatchPolicy(kfiFieldBatching)
	if err != nil {
		return nil, err
	}
	// Benthos counts `count: 1` as no policy; here it asks for one
	// record per batch.
	if !policy.IsNoop() || policy.Count == 1 {
		b, err := policy.NewBatcher(res)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", kfiFieldBatching, err)
		}
		f.batcher = &policyBatcher{b: b, count: policy.Count}
	}

	replay, err := conf.FieldBool(kfiFieldAutoReplayNacks)
	if err != nil {
		return nil, err
	}
	if !replay {
		return nil, fmt.Errorf("field %s: false would drop rejected messages; kafka_franz always delivers them again, so remove the field or set it to true", kfiFieldAutoReplayNacks)
	}

	instanceID := ""
	if conf.Contains(kfiFieldInstanceID) {
		if instanceID, err = conf.FieldString(kfiFieldInstanceID); err != nil {
			return nil, err
		}
	}

	dec, err := newBoundedDecompressor(int(min(batchBytesPerMessage*f.maxMessageBytes, math.MaxInt32)), f.log)
	if err != nil {
		return nil, err
	}
	f.probeOpts = append(slices.Clip(opts), kgo.WithLogger(kgoLogger{log: f.log}), kgo.WithHooks(f.outage))
	f.clientOpts = append(opts,
		kgo.ConsumerGroup(f.group),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(reset),
		// We commit ourselves, with CommitOffsetsSync, from our own
		// ack tracking (see checkpoint.go) rather than marking records
		// for franz-go's autocommit: the tracker is then the only place
		// that decides what is safe to commit, and a commit happens
		// exactly at commit_period, in OnPartitionsRevoked (where it must
		// be synchronous) and at Close, never behind our back.
		kgo.DisableAutoCommit(),
		// Rebalances wait until the records of a poll are registered
		// in the tracker, so a revoke always sees every record we hold
		// for the partitions it takes away.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(f.onAssigned),
		kgo.OnPartitionsRevoked(f.onRevoked),
		kgo.OnPartitionsLost(f.onLost),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(heartbeat),
		kgo.RebalanceTimeout(rebalance),
		kgo.FetchMaxBytes(fetchMax),
		kgo.FetchMaxPartitionBytes(fetchPartMax),
		kgo.BrokerMaxReadBytes(readMax),
		// franz-go's own decompressor bounds a batch at 1 GiB, and a
		// batch of a few KiB of zeros decompresses to that before a
		// record is read; ours bounds it by max_message_bytes (see
		// boundedDecompressor and refusedBatch; docs/guarantees.md #17).
		kgo.WithDecompressor(dec),
		kgo.WithLogger(kgoLogger{log: f.log}),
		kgo.WithHooks(f.outage),
	)
	if instanceID != "" {
		f.clientOpts = append(f.clientOpts, kgo.InstanceID(instanceID))
	}
	return f, nil
}

// parseBudget reads a byte size such as "64MiB" of at least one byte.
func parseBudget(conf *service.ParsedConfig, field string) (int64, error) {
	s, err := conf.FieldString(field)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("field %s: %q is not a byte size such as 64MiB: %w", field, s, err)
	}
	if n == 0 || n > 1<<62 {
		return 0, fmt.Errorf("field %s: %q must be at least 1B", field, s)
	}
	return int64(n), nil
}

// Connect creates the client and waits until a broker answers. While none
// does it keeps retrying with backoff (the outage is logged once), so a
// broker that starts after us is picked up; it returns only when connected
// or when ctx ends (at shutdown).
func (f *franzInput) Connect(ctx context.Context) error {
	f.mu.Lock()
	connected := f.client != nil
	f.mu.Unlock()
	if connected {
		return nil
	}

	// Wait with a plain client: a group client created while no broker
	// answers backs off its group join, and would start consuming
	// seconds after the broker is back.
	probe, err := kgo.NewClient(f.probeOpts...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}
	err = waitReachable(ctx, probe, f.log, f.outage)
	probe.Close()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(f.clientOpts...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	f.mu.Lock()
	f.client = cl
	f.runCancel = cancel
	f.parts = make(map[topicPartition]*partitionState)
	f.budget = &byteBudget{limit: f.maxBufferedBytes}
	f.mu.Unlock()

	f.wg.Add(1)
	go f.pollLoop(runCtx, cl)
	commits := f.commitLoop(runCtx, cl)
	f.mu.Lock()
	f.commits = commits
	f.mu.Unlock()
	f.log.Infof("kafka_franz: consuming as group %q", f.group)
	return nil
}

// ReadBatch returns the next batch (see nextBatch).
func (f *franzInput) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	batch, ack, err := f.readBatch(ctx)
	if err != nil && ctx.Err() != nil {
		// The engine stops reading: shutdown has begun, and it waits for
		// the acks of what was handed out before it closes the input.
		f.shutdown.Start()
	}
	if err == nil && len(batch) > 0 && f.tracer != nil {
		ack = traceBatch(f.tracer, batch, ack)
	}
	return batch, ack, err
}

// awaited describes the records the engine waits for at shutdown, "" when
// none.
func (f *franzInput) awaited() string {
	n := f.unacked.Load()
	if n <= 0 {
		return ""
	}
	what := "records"
	if n == 1 {
		what = "record"
	}
	return fmt.Sprintf("kafka_franz: %d %s read from Kafka to be persisted (acknowledged) before the final commit of group %q", n, what, f.group)
}

func (f *franzInput) readBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	f.readerMu.Lock()
	defer f.readerMu.Unlock()
	for {
		if !f.connected() {
			return nil, nil, service.ErrNotConnected
		}
		batch, ack, wait, err := f.nextBatch(ctx)
		if err != nil || batch != nil {
			return batch, ack, err
		}
		if err := f.waitForWork(ctx, wait); err != nil {
			return nil, nil, err
		}
	}
}

func (f *franzInput) connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.client != nil
}

// waitForWork blocks until records arrive, room is freed, wait elapses
// (when not negative) or ctx ends.
func (f *franzInput) waitForWork(ctx context.Context, wait time.Duration) error {
	var timer <-chan time.Time
	if wait >= 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-f.notify:
	case <-timer:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Close stops fetching, commits every acknowledged offset and leaves the
// group, so the partitions move to other members at once (a static member,
// with instance_id, stays until its session ends or it comes back).
func (f *franzInput) Close(ctx context.Context) error {
	f.mu.Lock()
	cl, cancel, commits := f.client, f.runCancel, f.commits
	f.client = nil
	f.mu.Unlock()
	f.signal() // a waiting reader sees that we are closed

	f.shutdown.Stop()
	if cl != nil {
		cancel()
		commits.Stop()
		f.wg.Wait()

		// Said before it starts: with the brokers gone this waits the
		// whole timeout, which would otherwise pass unexplained.
		f.log.Infof("kafka_franz: committing the final offsets of group %q and leaving it (waiting at most %v for the brokers)", f.group, f.closeTimeout)
		cctx, done := context.WithTimeout(ctx, f.closeTimeout)
		f.commitAll(cctx, cl, "final")
		cl.AllowRebalance()
		if err := cl.LeaveGroupContext(cctx); err != nil && !errors.Is(err, context.Canceled) {
			f.log.Warnf("kafka_franz: leaving group %q: %v; its partitions move after session_timeout", f.group, err)
		}
		done()
		cl.Close()
	}

	f.readerMu.Lock()
	defer f.readerMu.Unlock()
	if f.batcher != nil && !f.batcher.closed {
		f.batcher.closed = true
		return f.batcher.b.Close(ctx)
	}
	return nil
}

// buildMessages builds the messages of records of one partition, with the
// metadata listed in docs/components.md. A record larger than maxBytes
// becomes an oversized message, and the record lets go of its bytes.
func buildMessages(recs []*kgo.Record, maxBytes int64) []fetched {
	out := make([]fetched, len(recs))
	// Boxed once per call rather than once per message.
	var topic, partition any = recs[0].Topic, int64(recs[0].Partition)
	for i, r := range recs {
		if why := oversizeReason(r, maxBytes); why != "" {
			msg := oversizeMessage(topic, partition, r.Offset, why)
			msg.MetaSetMut(msgmeta.KafkaTimestampMs, r.Timestamp.UnixMilli())
			r.Value, r.Key, r.Headers = nil, nil, nil
			out[i] = fetched{rec: r, msg: msg}
			continue
		}
		out[i] = fetched{rec: r, msg: recordToMessage(r, topic, partition), size: recordSize(r)}
	}
	return out
}

// oversizeReason says why r is too large to deliver, "" when it is not.
func oversizeReason(r *kgo.Record, maxBytes int64) string {
	if n := int64(len(r.Value)); n > maxBytes {
		return fmt.Sprintf("record value is %d bytes, more than max_message_bytes (%d)", n, maxBytes)
	}
	if n := recordSize(r) - int64(len(r.Value)); n > maxBytes {
		return fmt.Sprintf("record key and headers are %d bytes, more than max_message_bytes (%d)", n, maxBytes)
	}
	return ""
}

// refusedBatch stands for a record batch that could not be decompressed
// within its bound (see boundedDecompressor): one oversized message at the batch's first offset, tracked as
// if it were the batch's last record, so that its ack commits the offset
// after the batch (docs/guarantees.md #17). franz-go tells us where the
// batch starts and ends, not what is in it, so its records are accounted
// for by this one message.
func (f *franzInput) refusedBatch(e *kgo.ErrDecompressTooLarge) fetched {
	last := max(e.NextOffset-1, e.Offset)
	extent := fmt.Sprintf("offset %d", e.Offset)
	if last > e.Offset {
		extent = fmt.Sprintf("offsets %d to %d", e.Offset, last)
	}
	why := fmt.Sprintf("record batch at %s does not decompress within %d bytes (%d times max_message_bytes, %d), so none of its records was read",
		extent, batchBytesPerMessage*f.maxMessageBytes, batchBytesPerMessage, f.maxMessageBytes)
	return fetched{
		rec: &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: last, LeaderEpoch: e.Epoch},
		msg: oversizeMessage(e.Topic, int64(e.Partition), e.Offset, why),
	}
}

// oversizeMessage is the empty message that stands for a record, or a
// batch, too large to deliver, with the Kafka coordinates it is stored
// under and the reason.
func oversizeMessage(topic, partition any, offset int64, why string) *service.Message {
	msg := service.NewMessage(nil)
	msg.MetaSetMut(msgmeta.KafkaTopic, topic)
	msg.MetaSetMut(msgmeta.KafkaPartition, partition)
	msg.MetaSetMut(msgmeta.KafkaOffset, offset)
	msgmeta.SetOversize(msg, why)
	return msg
}

// recordToMessage builds the message of a record; a tombstone becomes an
// empty body. topic and partition are the record's, boxed by the caller.
func recordToMessage(r *kgo.Record, topic, partition any) *service.Message {
	msg := service.NewMessage(r.Value)
	for _, h := range r.Headers {
		msg.MetaSetMut(h.Key, string(h.Value))
	}
	if r.Key != nil {
		msg.MetaSetMut(msgmeta.KafkaKey, string(r.Key))
	} else if len(r.Headers) > 0 {
		msg.MetaDelete(msgmeta.KafkaKey)
	}
	if len(r.Headers) > 0 {
		// Only the input says a record was too large.
		msg.MetaDelete(msgmeta.KafkaOversize)
	}
	msg.MetaSetMut(msgmeta.KafkaTopic, topic)
	msg.MetaSetMut(msgmeta.KafkaPartition, partition)
	msg.MetaSetMut(msgmeta.KafkaOffset, r.Offset)
	msg.MetaSetMut(msgmeta.KafkaTimestampMs, r.Timestamp.UnixMilli())
	return msg
}
