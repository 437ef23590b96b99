package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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

Delivery is at-least-once. Records are read per partition and handed to the pipeline in batches of consecutive records of one partition. An offset is committed only when the record at it and every earlier record of its partition have been acknowledged (delivered by the output, or filtered out by a processor); acknowledgements may arrive in any order and are tracked per partition. Offsets are committed every `+"`commit_period`"+`, when partitions are revoked in a rebalance, and on shutdown. After a crash, or a stop that does not drain, the records after the last commit are read again: duplicates are possible, losses are not.

A rejected (nacked) batch is never skipped: with `+"`auto_replay_nacks: true`"+` it is delivered again from memory with a backoff; with `+"`false`"+` the partition is rewound and the batch is fetched from Kafka again.

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
				Description("Batches records per partition before they enter the pipeline. Without a policy, each fetch gives one batch per partition; `count: 1` gives one record per batch. A partial batch is flushed early when its partition reaches `checkpoint_limit`. Note that if batching processors fail, Benthos drops the batch; keep them simple."),
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

// partBatcher builds the next batch of one partition under a batching
// policy.
type partBatcher struct {
	ps    *partitionState
	gen   uint64
	b     *service.Batcher
	queue []*kgo.Record // handed out, not yet added to b

	first, last int64
	epoch       int32
	n           int // records added to b
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
	f.mu.Unlock()

	f.wg.Add(2)
	go f.pollLoop(runCtx, cl)
	go f.commitLoop(runCtx, cl)
	f.log.Infof("kafka_franz: consuming as group %q", f.group)
	return nil
}

// pollLoop fetches records into the partitions' pending queues until ctx
// ends. It is the only goroutine that polls, pauses partitions and seeks.
func (f *franzInput) pollLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	lastErr := ""
	for {
		if !f.waitForRoom(ctx) {
			cl.AllowRebalance()
			return
		}
		pctx, wake := context.WithCancel(ctx)
		f.mu.Lock()
		f.wakePoll = wake
		if f.seekWanted {
			wake()
		}
		f.mu.Unlock()

		fetches := cl.PollRecords(pctx, f.checkpointLimit)
		wake()
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return
		}

		got := 0
		var seeks map[string]map[int32]kgo.EpochOffset
		f.mu.Lock()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			tp := topicPartition{fp.Topic, fp.Partition}
			ps := f.parts[tp]
			if ps == nil {
				ps = newPartitionState(tp)
				f.parts[tp] = ps
			}
			got += ps.add(fp.Records)
		})
		if f.seekWanted {
			f.seekWanted = false
			seeks = make(map[string]map[int32]kgo.EpochOffset)
			for tp, ps := range f.parts {
				if ps.seekTo < 0 {
					continue
				}
				if seeks[tp.topic] == nil {
					seeks[tp.topic] = make(map[int32]kgo.EpochOffset)
				}
				seeks[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: ps.seekTo}
				ps.seekTo = -1
			}
		}
		f.mu.Unlock()

		// franz-go asks for seeks before AllowRebalance, so no revoke
		// runs in between.
		if len(seeks) > 0 {
			cl.SetOffsets(seeks)
		}
		cl.AllowRebalance()
		if got > 0 {
			f.signal()
			lastErr = ""
		}

		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) {
				return
			}
			msg := fmt.Sprintf("fetching %s/%d: %v", topic, partition, err)
			if msg == lastErr {
				f.log.Debugf("kafka_franz: %s", msg)
				return
			}
			lastErr = msg
			f.log.Warnf("kafka_franz: %s (retrying)", msg)
		})
	}
}

// waitForRoom is the back-pressure: it blocks while some partition already
// has checkpoint_limit records fetched and waiting for the pipeline. Not
// polling leaves the next records in franz-go's buffer (one fetch per
// broker), which stops fetching altogether until we poll again. It reports
// false when ctx ends.
func (f *franzInput) waitForRoom(ctx context.Context) bool {
	for {
		f.mu.Lock()
		full := false
		if !f.seekWanted {
			for _, ps := range f.parts {
				if len(ps.pending) >= f.checkpointLimit {
					full = true
					break
				}
			}
		}
		f.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-f.room:
		case <-ctx.Done():
			return false
		}
	}
}

// roomFreed wakes the poll loop.
func (f *franzInput) roomFreed() {
	select {
	case f.room <- struct{}{}:
	default:
	}
}

// signal wakes the reader.
func (f *franzInput) signal() {
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

func (f *franzInput) commitLoop(ctx context.Context, cl *kgo.Client) {
	defer f.wg.Done()
	t := time.NewTicker(f.commitPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, max(f.commitPeriod, 10*time.Second))
			f.commitAll(cctx, cl, "periodic")
			cancel()
		}
	}
}

// commitAll commits the commit point of every partition that moved.
func (f *franzInput) commitAll(ctx context.Context, cl *kgo.Client, why string) {
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	f.mu.Lock()
	offsets := f.committableLocked(nil)
	f.mu.Unlock()
	f.commitLocked(ctx, cl, offsets, why)
}

// committableLocked returns the commit points that moved, of the given
// partitions or (nil) of all.
func (f *franzInput) committableLocked(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	out := make(map[string]map[int32]kgo.EpochOffset)
	add := func(tp topicPartition, ps *partitionState) {
		eo, ok := ps.committable()
		if !ok {
			return
		}
		if out[tp.topic] == nil {
			out[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		out[tp.topic][tp.partition] = eo
	}
	if only == nil {
		for tp, ps := range f.parts {
			add(tp, ps)
		}
		return out
	}
	for topic, ps := range only {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := f.parts[tp]; st != nil {
				add(tp, st)
			}
		}
	}
	return out
}

// commitLocked commits offsets synchronously; commitMu must be held.
func (f *franzInput) commitLocked(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]kgo.EpochOffset, why string) {
	if len(offsets) == 0 {
		return
	}
	var failed []string
	var reqErr error
	done := make(map[topicPartition]int64)
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					failed = append(failed, fmt.Sprintf("%s/%d: %v", t.Topic, p.Partition, perr))
					continue
				}
				if eo, ok := offsets[t.Topic][p.Partition]; ok {
					done[topicPartition{t.Topic, p.Partition}] = eo.Offset
				}
			}
		}
	})
	switch {
	case reqErr != nil && (errors.Is(reqErr, context.Canceled) || errors.Is(reqErr, kgo.ErrClientClosed)):
		f.log.Debugf("kafka_franz: %s commit abandoned: %v", why, reqErr)
	case reqErr != nil:
		f.log.Warnf("kafka_franz: %s commit of group %q failed, will retry: %v", why, f.group, reqErr)
	case len(failed) > 0:
		f.log.Warnf("kafka_franz: %s commit of group %q failed for %s, will retry", why, f.group, strings.Join(failed, ", "))
	}
	if len(done) == 0 {
		return
	}
	f.mu.Lock()
	for tp, off := range done {
		if ps := f.parts[tp]; ps != nil && off > ps.committed {
			ps.committed = off
		}
	}
	f.mu.Unlock()
	f.log.Tracef("kafka_franz: %s commit of %v", why, done)
}

func (f *franzInput) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if len(assigned) > 0 {
		f.log.Infof("kafka_franz: assigned partitions %s", formatPartitions(assigned))
	}
}

// onRevoked commits what is safe to commit for the revoked partitions and
// forgets them. Records of theirs still in the pipeline are not waited for:
// their acks are ignored and the next owner reads them again from the
// commit point (at-least-once).
func (f *franzInput) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	// Take the commit points and forget the partitions at once: an ack
	// arriving after this is not committed by us, whoever gets the
	// partition reads its records again.
	f.mu.Lock()
	offsets := f.committableLocked(revoked)
	f.dropLocked(revoked)
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, f.closeTimeout)
	f.commitLocked(cctx, cl, offsets, "revoke")
	cancel()
	f.log.Infof("kafka_franz: revoked partitions %s", formatPartitions(revoked))
}

// onLost forgets partitions that were taken away without a clean revoke: a
// commit would be rejected, and nothing past the last commit is lost since
// the next owner starts there.
func (f *franzInput) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 {
		return
	}
	f.mu.Lock()
	f.dropLocked(lost)
	f.mu.Unlock()
	f.log.Warnf("kafka_franz: lost partitions %s; records after their last commit will be consumed again", formatPartitions(lost))
}

func (f *franzInput) dropLocked(parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := f.parts[tp]; st != nil {
				st.drop()
				delete(f.parts, tp)
			}
		}
	}
	f.roomFreed()
}

func formatPartitions(m map[string][]int32) string {
	var parts []string
	for _, topic := range slices.Sorted(maps.Keys(m)) {
		ps := slices.Clone(m[topic])
		slices.Sort(ps)
		parts = append(parts, fmt.Sprintf("%s%v", topic, ps))
	}
	return strings.Join(parts, " ")
}

// ReadBatch returns the next batch of consecutive records of one partition.
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

// nextFetchBatch, without a batching policy, hands out the pending records
// of one partition (up to its room under checkpoint_limit) as a batch.
func (f *franzInput) nextFetchBatch() (service.MessageBatch, service.AckFunc) {
	f.mu.Lock()
	var (
		ps   *partitionState
		recs []*kgo.Record
		tb   *trackedBatch
	)
	for _, st := range f.parts {
		if len(st.pending) == 0 || st.handed >= f.checkpointLimit {
			continue
		}
		ps = st
		recs = st.take(min(f.maxFetchBatch, f.checkpointLimit-st.handed))
		f.roomFreed()
		last := recs[len(recs)-1]
		tb = st.track(recs[0].Offset, last.Offset, last.LeaderEpoch, len(recs))
		break
	}
	f.mu.Unlock()
	if ps == nil {
		return nil, nil
	}
	return recordsToBatch(recs), f.ackFunc(&replay{ps: ps, tb: tb, recs: recs})
}

// replay is a delivered batch as the input can deliver it again after a
// nack: from its records (rebuilt as they were read) or, when batching
// processors made it, from an untouched copy of the flushed messages.
type replay struct {
	ps   *partitionState
	tb   *trackedBatch
	recs []*kgo.Record
	msgs service.MessageBatch

	attempt int
	due     time.Time
}

func (r *replay) batch() service.MessageBatch {
	if r.msgs != nil {
		return r.msgs.Copy()
	}
	return recordsToBatch(r.recs)
}

// nextReplay returns a nacked batch whose backoff has passed, or how long
// until the next one is due (-1: none waiting).
func (f *franzInput) nextReplay(now time.Time) (service.MessageBatch, service.AckFunc, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := time.Duration(-1)
	for i := 0; i < len(f.replays); i++ {
		r := f.replays[i]
		if r.ps.dead || r.tb.dropped || r.tb.acked {
			f.replays = slices.Delete(f.replays, i, i+1)
			i--
			continue
		}
		if d := r.due.Sub(now); d > 0 {
			if wait < 0 || d < wait {
				wait = d
			}
			continue
		}
		f.replays = slices.Delete(f.replays, i, i+1)
		return r.batch(), f.ackFunc(r), -1
	}
	return nil, nil, wait
}

// replayBackoff is the wait before the n-th delivery of a nacked batch.
func replayBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<min(attempt-1, 16), 10*time.Second)
}

// nextPolicyBatch, with a batching policy, feeds each partition's batcher
// and flushes the first one that is due. It also returns how long until a
// period flush is due (-1: none), for ReadBatch to wait.
func (f *franzInput) nextPolicyBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, time.Duration, error) {
	type feed struct {
		pb      *partBatcher
		atLimit bool
	}
	var (
		feeds []feed
		stale []*partBatcher
	)
	f.mu.Lock()
	for tp, pb := range f.batchers {
		if ps := f.parts[tp]; ps == nil || ps != pb.ps || ps.gen != pb.gen {
			stale = append(stale, pb)
			delete(f.batchers, tp)
		}
	}
	for tp, ps := range f.parts {
		pb := f.batchers[tp]
		if pb == nil {
			if len(ps.pending) == 0 {
				continue
			}
			pb = &partBatcher{ps: ps, gen: ps.gen}
			f.batchers[tp] = pb
		}
		if room := f.checkpointLimit - ps.handed; room > 0 && len(ps.pending) > 0 {
			pb.queue = append(pb.queue, ps.take(room)...)
			f.roomFreed()
		}
		feeds = append(feeds, feed{pb: pb, atLimit: ps.handed >= f.checkpointLimit})
	}
	f.mu.Unlock()

	for _, pb := range stale {
		if pb.b != nil {
			_ = pb.b.Close(ctx)
		}
	}

	wait := time.Duration(-1)
	for _, fd := range feeds {
		pb := fd.pb
		if pb.b == nil {
			b, err := f.batchPolicy.NewBatcher(f.res)
			if err != nil {
				return nil, nil, -1, fmt.Errorf("creating batcher: %w", err)
			}
			pb.b = b
		}
		full := false
		for len(pb.queue) > 0 && !full {
			r := pb.queue[0]
			pb.queue[0] = nil
			pb.queue = pb.queue[1:]
			if pb.n == 0 {
				pb.first = r.Offset
			}
			pb.last, pb.epoch = r.Offset, r.LeaderEpoch
			pb.n++
			full = pb.b.Add(recordToMessage(r, r.Topic, int64(r.Partition)))
		}
		if pb.n == 0 {
			continue
		}
		until, timed := pb.b.UntilNext()
		due := timed && until <= time.Millisecond
		if !full && !due && !(fd.atLimit && len(pb.queue) == 0) {
			if timed && (wait < 0 || until < wait) {
				wait = until
			}
			continue
		}

		msgs, err := pb.b.Flush(ctx)
		if err != nil {
			return nil, nil, -1, fmt.Errorf("flushing batch: %w", err)
		}
		first, last, epoch, n := pb.first, pb.last, pb.epoch, pb.n
		pb.n = 0

		f.mu.Lock()
		ps := pb.ps
		if ps.dead || ps.gen != pb.gen {
			// Revoked or rewound while we built it: its records are
			// read again by whoever owns the partition now.
			f.mu.Unlock()
			continue
		}
		tb := ps.track(first, last, epoch, n)
		f.mu.Unlock()
		r := &replay{ps: ps, tb: tb, msgs: msgs}
		ack := f.ackFunc(r)
		if len(msgs) == 0 {
			if ctx.Err() != nil {
				// The batching processors were interrupted: leave
				// the records unacked so they are read again.
				return nil, nil, -1, ctx.Err()
			}
			// The batching processors filtered every message out,
			// which counts as delivered.
			_ = ack(ctx, nil)
			continue
		}
		if f.replayNacks {
			// Downstream processors may change the messages we hand
			// out; a replay needs them as they were.
			return msgs.Copy(), ack, -1, nil
		}
		r.msgs = nil
		return msgs, ack, -1, nil
	}
	return nil, nil, wait, nil
}

// ackFunc returns the acknowledgement of a delivered batch. An ack
// releases the batch (see partitionState.ack); a nack either queues it to be
// delivered again after a backoff (auto_replay_nacks) or rewinds the
// partition to it. It is never skipped.
func (f *franzInput) ackFunc(r *replay) service.AckFunc {
	return func(_ context.Context, err error) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		ps, tb := r.ps, r.tb
		if ps.dead || tb.dropped || tb.acked {
			return nil
		}
		if err == nil {
			if ps.ack(tb) {
				f.signal() // room in the pipeline for more of this partition
			}
			return nil
		}
		if f.replayNacks {
			r.attempt++
			r.due = time.Now().Add(replayBackoff(r.attempt))
			f.replays = append(f.replays, r)
			f.log.Debugf("kafka_franz: batch %s/%d offsets %d-%d was rejected, delivering it again in %s: %v",
				ps.tp.topic, ps.tp.partition, tb.first, tb.last, replayBackoff(r.attempt), err)
			f.signal()
			return nil
		}
		if ps.rewind(tb) {
			f.log.Warnf("kafka_franz: batch %s/%d offsets %d-%d was rejected, reading the partition again from offset %d: %v",
				ps.tp.topic, ps.tp.partition, tb.first, tb.last, tb.first, err)
			f.seekWanted = true
			if f.wakePoll != nil {
				f.wakePoll()
			}
			f.roomFreed()
		}
		return nil
	}
}

// Close stops fetching, commits every acknowledged offset and leaves the
// group, so the partitions move to other members at once.
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

// recordsToBatch turns records of one partition into messages with the
// metadata listed in docs/components.md. A tombstone becomes an empty body.
func recordsToBatch(recs []*kgo.Record) service.MessageBatch {
	if len(recs) == 0 {
		return nil
	}
	// Boxed once per batch rather than once per message.
	var topic, partition any = recs[0].Topic, int64(recs[0].Partition)
	batch := make(service.MessageBatch, len(recs))
	for i, r := range recs {
		batch[i] = recordToMessage(r, topic, partition)
	}
	return batch
}

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
