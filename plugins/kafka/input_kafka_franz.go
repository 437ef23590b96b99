package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	kfiFieldTopics                 = "topics"
	kfiFieldConsumerGroup          = "consumer_group"
	kfiFieldInstanceID             = "instance_id"
	kfiFieldCheckpointLimit        = "checkpoint_limit"
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

func franzInputSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Services").
		Summary("Consumes Kafka topics as a member of a consumer group, committing an offset only once every message up to it has been acknowledged.").
		Description(`
Built on [franz-go](https://github.com/twmb/franz-go). The field names follow Redpanda Connect's `+"`kafka_franz`"+` input where the two overlap, so configs port over.

### Delivery guarantees

Delivery is at-least-once. Without a batching policy, a batch holds what has been read of every partition with room under `+"`checkpoint_limit`"+` (consecutive records of each partition, at most `+"`checkpoint_limit`"+` records in all); with one, a batch holds consecutive records of one partition. An offset is committed only when the record at it and every earlier record of its partition have been acknowledged (delivered by the output, or filtered out by a processor); acknowledgements may arrive in any order and are tracked per partition. Offsets are committed every `+"`commit_period`"+`, when partitions are revoked in a rebalance, and on shutdown. After a crash, or a stop that does not drain, the records after the last commit are read again: duplicates are possible, losses are not.

A rejected (nacked) batch is never skipped: with `+"`auto_replay_nacks: true`"+` it is delivered again from memory with a backoff; with `+"`false`"+` each partition in it is rewound and its records are fetched from Kafka again.

### Back-pressure

At most `+"`checkpoint_limit`"+` records of a partition are in the pipeline without an acknowledgement. Up to as many more are read ahead; while any partition has that many read ahead, the input stops fetching until the pipeline takes them. Memory stays bounded whatever the output does.

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
- every record header, by its name (a header cannot override the keys above)

A tombstone (null value) or an empty value is delivered as a message with an empty body.`).
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
			service.NewDurationField(kfiFieldCommitPeriod).
				Description("How often acknowledged offsets are committed. Offsets are also committed when partitions are revoked and on shutdown.").
				Default("5s"),
			service.NewBoolField(kfiFieldStartFromOldest).
				Description("Where a consumer group without a committed offset starts: the oldest available record (true) or only new records (false). Also applies when a committed offset is no longer available.").
				Default(true),
			service.NewStringField(kfiFieldFetchMaxBytes).
				Description("The most data one fetch request may return (Kafka's `fetch.max.bytes`). A single record larger than this is still returned whole, so large messages are consumed anyway.").
				Default("50MiB").
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
				Description("How long the group waits for members to rejoin during a rebalance.").
				Default("45s").
				Advanced(),
			tlsField(),
			saslField(),
			service.NewBatchPolicyField(kfiFieldBatching).
				Description("Batches records per partition before they enter the pipeline. Without a policy, whatever has been read of every partition goes into one batch, up to `checkpoint_limit` records; `count: 1` gives one record per batch. A partial batch is flushed early when its partition reaches `checkpoint_limit`. Note that if batching processors fail, Benthos drops the batch; keep them simple."),
			service.NewBoolField(kfiFieldAutoReplayNacks).
				Description("Whether a rejected (nacked) batch is replayed from memory, with backoff, until it succeeds (true), or the partition is rewound so the batch and everything after it are fetched from Kafka again (false, which holds less memory). Either way nothing is skipped and no offset is committed past the rejected records.").
				Default(true),
		).
		Example("Ingest", "Consume two topics in a shared group, committing every 5 seconds.", `
input:
  kafka_franz:
    seed_brokers: [ "${KAFKA_BROKERS:localhost:9092}" ]
    topics: [ "device-vehicle-event", "device-heartbeat" ]
    consumer_group: "${KAFKA_GROUP:forwarder}"
    checkpoint_limit: 1024
    commit_period: 5s
    start_from_oldest: true
    batching:
      count: 100
      period: 50ms
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
			// Nacks are replayed by the input itself (see ackFunc) rather
			// than by service.AutoRetryNacksBatched, which copies and
			// re-sorts every message of every batch to support a replay
			// that is rare.
			return newFranzInputFromParsed(conf, res)
		})
}

// franzInput is the kafka_franz input. Several goroutines share its state
// under mu: the poll loop (fetches records, stops while a partition has
// checkpoint_limit records read ahead, applies rewinds), the reader
// (ReadBatch, builds batches), whoever calls the ack functions, and the
// committers (the commit loop and franz-go's rebalance callbacks).
type franzInput struct {
	log *service.Logger
	res *service.Resources

	clientOpts      []kgo.Opt
	probeOpts       []kgo.Opt // connection options only: the client Connect waits with
	group           string
	checkpointLimit int
	commitPeriod    time.Duration
	closeTimeout    time.Duration
	replayNacks     bool                // auto_replay_nacks: replay from memory, else rewind
	batchPolicy     service.BatchPolicy // IsNoop: one batch per partition per fetch
	maxFetchBatch   int                 // with a no-op policy, the most records per batch
	outage          *outageLogger

	mu         sync.Mutex
	client     *kgo.Client
	parts      map[topicPartition]*partitionState
	seekWanted bool               // some partition waits for a rewind
	wakePoll   context.CancelFunc // interrupts the poll loop's current poll
	notify     chan struct{}      // capacity 1: records are ready or room was freed
	room       chan struct{}      // capacity 1: pending records were taken or dropped
	runCancel  context.CancelFunc
	wg         sync.WaitGroup
	replays    []*replay // nacked batches waiting to be delivered again

	// commitMu orders commits, so a periodic commit built before a
	// rebalance cannot land after the revoke's commit of the same partition.
	commitMu sync.Mutex

	// batchers, with a batching policy, are owned by the reader goroutine
	// (and Close, which runs after the reader has stopped).
	batchers map[topicPartition]*partBatcher
}

func newFranzInputFromParsed(conf *service.ParsedConfig, res *service.Resources) (*franzInput, error) {
	opts, err := parseCommonOpts(conf)
	if err != nil {
		return nil, err
	}
	f := &franzInput{
		log:      res.Logger(),
		res:      res,
		parts:    make(map[topicPartition]*partitionState),
		notify:   make(chan struct{}, 1),
		room:     make(chan struct{}, 1),
		batchers: make(map[topicPartition]*partBatcher),
	}
	f.outage = newOutageLogger(f.log)

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
	f.closeTimeout = max(session, 5*time.Second)

	if f.batchPolicy, err = conf.FieldBatchPolicy(kfiFieldBatching); err != nil {
		return nil, err
	}
	// Benthos counts `count: 1` as no batching, which for an input that
	// batches per fetch would mean the opposite of what was asked.
	f.maxFetchBatch = f.checkpointLimit
	if f.batchPolicy.Count == 1 {
		f.maxFetchBatch = 1
	}
	if !f.batchPolicy.IsNoop() {
		// Build one now so a broken policy fails at start-up, not on the
		// first record.
		b, err := f.batchPolicy.NewBatcher(res)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", kfiFieldBatching, err)
		}
		_ = b.Close(context.Background())
	}

	if f.replayNacks, err = conf.FieldBool(kfiFieldAutoReplayNacks); err != nil {
		return nil, err
	}

	instanceID := ""
	if conf.Contains(kfiFieldInstanceID) {
		if instanceID, err = conf.FieldString(kfiFieldInstanceID); err != nil {
			return nil, err
		}
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
		kgo.WithLogger(kgoLogger{log: f.log}),
		kgo.WithHooks(f.outage),
	)
	if instanceID != "" {
		f.clientOpts = append(f.clientOpts, kgo.InstanceID(instanceID))
	}
	return f, nil
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
	f.replays = nil
	f.seekWanted = false
	f.mu.Unlock()

	f.wg.Add(2)
	go f.pollLoop(runCtx, cl)
	go f.commitLoop(runCtx, cl)
	f.log.Infof("kafka_franz: consuming as group %q", f.group)
	return nil
}

// ReadBatch returns the next batch: runs of consecutive records, one run per
// partition (see nextFetchBatch and nextPolicyBatch).
func (f *franzInput) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	for {
		f.mu.Lock()
		if f.client == nil {
			f.mu.Unlock()
			return nil, nil, service.ErrNotConnected
		}
		f.mu.Unlock()

		batch, ack, wait := f.nextReplay(time.Now())
		if batch != nil {
			return batch, ack, nil
		}
		var (
			policyWait time.Duration = -1
			err        error
		)
		if f.batchPolicy.IsNoop() {
			batch, ack = f.nextFetchBatch()
		} else {
			batch, ack, policyWait, err = f.nextPolicyBatch(ctx)
			if err != nil {
				return nil, nil, err
			}
		}
		if batch != nil {
			return batch, ack, nil
		}
		if wait < 0 || (policyWait >= 0 && policyWait < wait) {
			wait = policyWait
		}

		if err := f.waitForWork(ctx, wait); err != nil {
			return nil, nil, err
		}
	}
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
	cl, cancel := f.client, f.runCancel
	f.client = nil
	f.mu.Unlock()

	if cl != nil {
		cancel()
		f.wg.Wait()

		cctx, done := context.WithTimeout(ctx, f.closeTimeout)
		f.commitAll(cctx, cl, "final")
		cl.AllowRebalance()
		if err := cl.LeaveGroupContext(cctx); err != nil && !errors.Is(err, context.Canceled) {
			f.log.Warnf("kafka_franz: leaving group %q: %v; its partitions move after session_timeout", f.group, err)
		}
		done()
		cl.Close()
	}

	for tp, pb := range f.batchers {
		if pb.b != nil {
			_ = pb.b.Close(ctx)
		}
		delete(f.batchers, tp)
	}
	return nil
}

// buildMessages builds the messages of records of one partition, with the
// metadata listed in docs/components.md.
func buildMessages(recs []*kgo.Record) []fetched {
	out := make([]fetched, len(recs))
	// Boxed once per call rather than once per message.
	var topic, partition any = recs[0].Topic, int64(recs[0].Partition)
	for i, r := range recs {
		out[i] = fetched{rec: r, msg: recordToMessage(r, topic, partition)}
	}
	return out
}

// recordToMessage builds the message of a record; a tombstone becomes an
// empty body. topic and partition are the record's, boxed by the caller.
func recordToMessage(r *kgo.Record, topic, partition any) *service.Message {
	msg := service.NewMessage(r.Value)
	for _, h := range r.Headers {
		msg.MetaSetMut(h.Key, string(h.Value))
	}
	if r.Key != nil {
		msg.MetaSetMut(metaKey, string(r.Key))
	} else if len(r.Headers) > 0 {
		msg.MetaDelete(metaKey)
	}
	msg.MetaSetMut(metaTopic, topic)
	msg.MetaSetMut(metaPartition, partition)
	msg.MetaSetMut(metaOffset, r.Offset)
	msg.MetaSetMut(metaTimestampMs, r.Timestamp.UnixMilli())
	return msg
}
