package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/plural"
	"github.com/forwarder/forwarder/internal/shutdownlog"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// commitWarnWindow is the least time between two warnings of failed commits
// of one kind (periodic, revoke, final); the ones in between are counted.
const commitWarnWindow = time.Minute

// metricConsumerLag is the per-partition lag gauge (docs/components.md).
const metricConsumerLag = "forwarder_kafka_consumer_lag"

// metricPartitionsAssigned counts, per configured topic, the partitions
// assigned to this member: 0 for a topic on every instance means nothing
// reads it.
const metricPartitionsAssigned = "forwarder_kafka_partitions_assigned"

// batchBytesPerMessage is how many times max_message_bytes a compressed
// record batch may decompress to. Producers put a record larger than their
// batch size in a batch of its own, so a batch past this holds a record far
// past max_message_bytes; the room above one message is for producers that
// batch several large messages together (docs/guarantees.md #17).
const batchBytesPerMessage = 4

// maxWireDuration is the longest fetch_max_wait, session_timeout and
// rebalance_timeout: Kafka's requests carry them as an int32 count of
// milliseconds, and franz-go would wrap a longer fetch wait and refuses a
// longer timeout when the client is created.
const maxWireDuration = math.MaxInt32 * time.Millisecond

// minGroupTimeout is the shortest session_timeout and rebalance_timeout
// franz-go accepts.
const minGroupTimeout = 100 * time.Millisecond

// franzInput is the kafka_franz input. Several goroutines share its state
// under mu: the poll loop (fetches records, stops while the input holds
// what its limits allow), the reader (ReadBatch, hands out batches),
// whoever calls the ack functions, the commit loop and franz-go's rebalance
// callbacks. No network call is made with mu held.
type franzInput struct {
	log      *service.Logger
	lag      *service.MetricGauge
	assigned *service.MetricGauge
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
	// commitWarns holds failed commits to a line per kind a minute: a
	// deleted topic fails every periodic commit until it is back.
	commitWarns *lograte.Burst
	topics      []string
	expired     *expiredCheck
	recreated   *recreatedTopics
	// started is the process's launch gate: an exit while the process
	// starts (launch.Gate.Abandon) closes the input, so that its group
	// moves the partitions on at once, not after session_timeout.
	started *launch.Gate

	mu             sync.Mutex
	client         *kgo.Client
	parts          map[topicPartition]*partitionState
	owned          map[string]int // partitions assigned, per configured topic
	budget         *byteBudget
	polls          uint64             // polls that returned records, for the lag refresh
	cancelPeriodic context.CancelFunc // abandons the periodic commit in flight, if any
	notify         chan struct{}      // capacity 1: records are ready or room was freed
	room           chan struct{}      // capacity 1: pending records were taken or dropped
	runCancel      context.CancelFunc
	commits        *periodic.Loop // commits every commit_period while connected
	forgetRelease  func()         // unregisters the close on an early exit
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
		log:      res.Logger(),
		lag:      res.Metrics().NewGauge(metricConsumerLag, "topic", "partition"),
		assigned: res.Metrics().NewGauge(metricPartitionsAssigned, "topic"),
		tracer:   tracectx.Tracer(res),
		parts:    make(map[topicPartition]*partitionState),
		notify:   make(chan struct{}, 1),
		room:     make(chan struct{}, 1),

		started: launch.Process,
	}
	f.outage = newOutageLogger(f.log)
	f.commitWarns = lograte.New(f.log, commitWarnWindow)
	f.expired = &expiredCheck{log: f.log, lost: res.Metrics().NewCounter(metricRecordsExpired)}
	metricseries.Counter(f.expired.lost)
	f.recreated = &recreatedTopics{signal: make(chan struct{}, 1)}
	f.shutdown = shutdownlog.New(f.log, shutdownlog.Interval, f.awaited)

	topics, err := parseList(conf, kfiFieldTopics, "topic")
	if err != nil {
		return nil, err
	}
	f.topics = topics

	f.group = pluginconf.Field(&err, conf.FieldString, kfiFieldConsumerGroup)
	f.checkpointLimit = pluginconf.Field(&err, conf.FieldInt, kfiFieldCheckpointLimit)
	f.commitPeriod = pluginconf.Field(&err, conf.FieldDuration, kfiFieldCommitPeriod)
	oldest := pluginconf.Field(&err, conf.FieldBool, kfiFieldStartFromOldest)
	fetchWait := pluginconf.Field(&err, conf.FieldDuration, kfiFieldFetchMaxWait)
	session := pluginconf.Field(&err, conf.FieldDuration, kfiFieldSessionTimeout)
	heartbeat := pluginconf.Field(&err, conf.FieldDuration, kfiFieldHeartbeatInterval)
	rebalance := pluginconf.Field(&err, conf.FieldDuration, kfiFieldRebalanceTimeout)
	policy := pluginconf.Field(&err, conf.FieldBatchPolicy, kfiFieldBatching)
	replay := pluginconf.Field(&err, conf.FieldBool, kfiFieldAutoReplayNacks)
	instanceID := ""
	if conf.Contains(kfiFieldInstanceID) {
		instanceID = pluginconf.Field(&err, conf.FieldString, kfiFieldInstanceID)
	}
	if err != nil {
		return nil, err
	}

	if err := checkConsumerGroup(f.group); err != nil {
		return nil, err
	}
	f.group = strings.TrimSpace(f.group)
	f.expired.group = f.group
	if err := checkCheckpointLimit(f.checkpointLimit); err != nil {
		return nil, err
	}
	if f.maxBufferedBytes, err = parseBudget(conf, kfiFieldMaxBufferedBytes); err != nil {
		return nil, err
	}
	maxMessage, err := parseByteSize(conf, kfiFieldMaxMessageBytes)
	if err != nil {
		return nil, err
	}
	f.maxMessageBytes = int64(maxMessage)
	if err := checkPositive(kfiFieldCommitPeriod)(f.commitPeriod); err != nil {
		return nil, err
	}

	reset := kgo.NewOffset().AtEnd()
	if oldest {
		reset = kgo.NewOffset().AtStart()
	}

	fetchMax, err := parseBrokerIOSize(conf, kfiFieldFetchMaxBytes)
	if err != nil {
		return nil, err
	}
	fetchPartMax, err := parseBrokerIOSize(conf, kfiFieldFetchMaxPartitionBytes)
	if err != nil {
		return nil, err
	}
	fetchMin, err := parseByteSize(conf, kfiFieldFetchMinBytes)
	if err != nil {
		return nil, err
	}
	if err := checkFetchMaxWait(fetchWait); err != nil {
		return nil, err
	}
	// franz-go refuses responses above BrokerMaxReadBytes, which must
	// leave room for a full fetch.
	readMax := brokerIOBytes(fetchMax)

	if err := cmp.Or(checkGroupTimeout(kfiFieldSessionTimeout)(session), checkGroupTimeout(kfiFieldRebalanceTimeout)(rebalance),
		checkHeartbeat(heartbeat, session)); err != nil {
		return nil, err
	}
	// A commit in flight holds up this member's next join (franz-go does
	// not join while committing), and the commit on revoke holds up its
	// rejoin: a third of the rebalance timeout each leaves the member
	// time to rejoin before the group gives up on it.
	f.commitTimeout = rebalance / 3
	f.closeTimeout = max(session, 5*time.Second)

	// Benthos counts `count: 1` as no policy; here it asks for one
	// record per batch.
	if !policy.IsNoop() || policy.Count == 1 {
		b, err := policy.NewBatcher(res)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", kfiFieldBatching, err)
		}
		f.batcher = &policyBatcher{b: b, count: policy.Count, atOnce: !policyTriggers(policy)}
	}

	if err := checkAutoReplayNacks(replay); err != nil {
		return nil, err
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
		kgo.AdjustFetchOffsetsFn(f.adjustFetchOffsets),
		// Records of a transaction are read once it commits, and never
		// when it aborts: a producer that rolled an event back does not
		// want it delivered (billed). franz-go's default, like Java's,
		// reads them all. A transaction left open holds the partition
		// back until the broker aborts it (transaction.max.timeout.ms).
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A transaction ends with a marker, an offset no message stands
		// for. Kept, it lets the commit point pass the marker once the
		// records before it are acked (partitionState.addMarker), as a Java
		// consumer's position does: otherwise a partition whose last
		// write ended a transaction stays committed one offset short of
		// its end, and a lone aborted transaction is never committed past.
		kgo.KeepControlRecords(),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(heartbeat),
		kgo.RebalanceTimeout(rebalance),
		kgo.FetchMaxBytes(fetchMax),
		kgo.FetchMaxPartitionBytes(fetchPartMax),
		kgo.FetchMinBytes(fetchMin),
		kgo.FetchMaxWait(fetchWait),
		kgo.BrokerMaxReadBytes(readMax),
		// franz-go's own decompressor bounds a batch at 1 GiB, and a
		// batch of a few KiB of zeros decompresses to that before a
		// record is read; ours bounds it by max_message_bytes (see
		// boundedDecompressor and refusedBatch; docs/guarantees.md #17).
		kgo.WithDecompressor(dec),
		kgo.WithLogger(kgoLogger{log: f.log, outOfRange: f.expired.outOfRange, recreated: f.recreated.add}),
		kgo.WithHooks(f.outage),
	)
	if instanceID != "" {
		f.clientOpts = append(f.clientOpts, kgo.InstanceID(instanceID))
	}
	return f, nil
}

// errExiting refuses a connection while the process exits before it
// started: the input was closed to leave its group, and must not join again.
var errExiting = errors.New("kafka_franz: not connecting: the process is exiting before it started")

// Connect creates the client and waits until a broker answers. While none
// does it keeps retrying with backoff (the outage is logged once), so a
// broker that starts after us is picked up; it returns only when connected
// or when ctx ends (at shutdown).
func (f *franzInput) Connect(ctx context.Context) error {
	if f.connected() {
		return nil
	}
	if f.started.Cancelled() {
		// The process is exiting before it started, and this input was
		// closed to leave its group (or is being closed, by
		// launch.Gate.Abandon, while the engine asks again): joining again
		// would leave a member behind, and the close under way still
		// waits for the previous client's loops.
		return errExiting
	}

	// Wait with a plain client: a group client created while no broker
	// answers backs off its group join, and would start consuming
	// seconds after the broker is back.
	probe, err := reachableClient(ctx, f.probeOpts, f.log, f.outage)
	if err != nil {
		return err
	}
	probe.Close()
	// The client joins the group as soon as it is created, and its
	// first assignment (onAssigned) may come before NewClient returns:
	// the state it counts into is made first.
	f.mu.Lock()
	f.parts = make(map[topicPartition]*partitionState)
	f.budget = &byteBudget{limit: f.maxBufferedBytes}
	f.resetOwnedLocked()
	f.mu.Unlock()
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
	go f.resubscribeLoop(runCtx, cl)
	commits := f.commitLoop(runCtx, cl)
	forget := f.started.OnCancel(func(ctx context.Context) { _ = f.Close(ctx) })
	f.mu.Lock()
	f.commits = commits
	f.forgetRelease = forget
	f.mu.Unlock()
	if f.started.Cancelled() {
		// The process is exiting before it started (launch.Gate.Abandon
		// closed this input, or began before this connection registered
		// its release): leave at once rather than join again.
		_ = f.Close(ctx)
		return errExiting
	}
	f.log.Infof("kafka_franz: consuming as group %q", f.group)
	f.warnMissingTopics(ctx, cl)
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
	return fmt.Sprintf("kafka_franz: %s read from Kafka to be persisted (acknowledged) before the final commit of group %q",
		plural.Count(n, "record", "records"), f.group)
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
	cl, cancel, commits, forget := f.client, f.runCancel, f.commits, f.forgetRelease
	f.client, f.forgetRelease = nil, nil
	f.mu.Unlock()
	if forget != nil {
		forget()
	}
	f.signal() // a waiting reader sees that we are closed

	f.shutdown.Stop()
	if cl != nil {
		cancel()
		commits.Stop()
		f.wg.Wait()

		// Said before it starts: with the brokers gone this waits the
		// whole timeout (or what is left of ctx's, if less, as when a
		// stop while starting bounds it), which would otherwise pass
		// unexplained.
		cctx, done := context.WithTimeout(ctx, f.closeTimeout)
		dl, _ := cctx.Deadline() // WithTimeout sets one
		wait := max(time.Until(dl), 0).Round(100 * time.Millisecond)
		f.log.Infof("kafka_franz: committing the final offsets of group %q and leaving it (waiting at most %v for the brokers)", f.group, wait)
		f.commitAll(cctx, cl, "final")
		cl.AllowRebalance()
		if err := cl.LeaveGroupContext(cctx); err != nil && !errors.Is(err, context.Canceled) {
			f.log.Warnf("kafka_franz: leaving group %q: %v; its partitions move after session_timeout", f.group, err)
		}
		done()
		cl.Close()
		f.commitWarns.Flush() // the failed commits not logged yet
	}

	f.readerMu.Lock()
	defer f.readerMu.Unlock()
	if f.batcher != nil && !f.batcher.closed {
		f.batcher.closed = true
		return f.batcher.b.Close(ctx)
	}
	return nil
}
