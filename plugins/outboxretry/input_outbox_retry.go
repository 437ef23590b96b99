// Package outboxretry provides the outbox_retry input: the dispatcher that
// claims due outbox rows (new ones, retries and abandoned claims) and hands
// them to the pipeline.
package outboxretry

import (
	"cmp"
	"context"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/plural"
	"github.com/forwarder/forwarder/internal/shutdownlog"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// Metric names (docs/reference/outbox_retry.md).
const (
	metricClaimedRows    = "forwarder_claimed_rows_total"
	metricClaimBatchSize = "forwarder_claim_batch_size"
	metricDirectRows     = "forwarder_direct_rows_total"
	metricLeasesRenewed  = "forwarder_leases_renewed_total"
	metricClaimsLost     = "forwarder_claims_lost_total"
	metricCompensated    = "forwarder_compensation_requeued_total"
	metricCompWaiting    = "forwarder_compensation_waiting_rows"
	metricFrozen         = "forwarder_records_frozen"
	metricOrderRepairs   = "forwarder_ordering_repairs_total"
)

// outboxRetry is the outbox_retry input: a thin adapter that turns the rows
// the dispatcher engine (internal/dispatch) hands out into messages, and
// their acknowledgements back into settled claims.
type outboxRetry struct {
	d   *dispatch.Dispatcher
	hub *dispatch.Hub
	log *service.Logger
	// tracer starts the outbox.claim span of each traced row; nil when the
	// stream does not trace.
	tracer trace.Tracer
	// width is the partition width (partition_width).
	width time.Duration
	// retention is nil unless retention.older_than is set.
	retention *retentionConfig

	mu      sync.Mutex
	upkeep  *maintenance
	started bool

	// shutdown says, from the moment the engine stops reading until Close,
	// how many rows handed out are still in flight: the engine waits for
	// their acknowledgement before it closes anything.
	shutdown *shutdownlog.Watch
}

func newOutboxRetryFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*outboxRetry, error) {
	var (
		cfg dispatch.DispatcherConfig
		err error
	)
	cfg.BatchSize = pluginconf.Field(&err, conf.FieldInt, orFieldBatchSize)
	cfg.Lease = pluginconf.Field(&err, conf.FieldDuration, orFieldLease)
	cfg.PollInterval = pluginconf.Field(&err, conf.FieldDuration, orFieldPollInterval)
	cfg.Claimer = pluginconf.Field(&err, conf.FieldString, orFieldInstanceID)
	cfg.MaxUnacked = pluginconf.Field(&err, conf.FieldInt, orFieldMaxUnacked)
	cfg.MaxDirect = pluginconf.Field(&err, conf.FieldInt, orFieldMaxUnackedDirect)
	maxBytes := pluginconf.Field(&err, conf.FieldString, orFieldMaxUnackedBytes)
	ownAttempts := conf.Contains(orFieldMaxAttempts) // else the output's
	if ownAttempts {
		cfg.MaxAttempts = pluginconf.Field(&err, conf.FieldInt, orFieldMaxAttempts)
	}
	cfg.NackDelay = pluginconf.Field(&err, conf.FieldDuration, orFieldNackDelay)
	rq := conf.Namespace(orFieldRequeue)
	cfg.Compensation.After = pluginconf.Field(&err, rq.FieldDuration, orFieldRequeueAfter)
	cfg.Compensation.Rounds = pluginconf.Field(&err, rq.FieldInt, orFieldRequeueRounds)
	onFailed := pluginconf.Field(&err, conf.FieldString, orFieldOrderOnFailed)
	width := pluginconf.Field(&err, conf.FieldString, orFieldPartitionWidth)
	if err != nil {
		return nil, err
	}
	if cfg.MaxUnackedBytes, err = parseMaxUnackedBytes(maxBytes); err != nil {
		return nil, err
	}
	if cfg.OrderOnFailed, err = parseOrderOnFailed(onFailed); err != nil {
		return nil, err
	}
	if ownAttempts {
		err = checkMaxAttempts(cfg.MaxAttempts)
	}
	if err = cmp.Or(err, checkRequeue(cfg.Compensation.After, cfg.Compensation.Rounds),
		checkBatchSize(cfg.BatchSize), checkLease(cfg.Lease), checkPollInterval(cfg.PollInterval),
		checkMaxUnacked(cfg.MaxUnacked), checkMaxUnackedDirect(cfg.MaxDirect), checkNackDelay(cfg.NackDelay)); err != nil {
		return nil, err
	}
	in := &outboxRetry{log: mgr.Logger(), tracer: tracectx.Tracer(mgr)}
	if in.width, err = parsePartitionWidth(width); err != nil {
		return nil, err
	}
	if in.retention, err = parseRetention(conf.Namespace(orFieldRetention)); err != nil {
		return nil, err
	}
	if cfg.Claimer == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "forwarder"
		}
		cfg.Claimer = host + "-" + strconv.Itoa(os.Getpid())
	}
	hub, err := dispatch.HubFromParsed(conf, mgr)
	if err != nil {
		return nil, err
	}
	m := mgr.Metrics()
	dm := dispatch.DispatcherMetrics{
		Claimed:   m.NewCounter(metricClaimedRows),
		BatchSize: m.NewGauge(metricClaimBatchSize),
		Direct:    m.NewCounter(metricDirectRows),
		Renewed:   m.NewCounter(metricLeasesRenewed),
		Lost:      m.NewCounter(metricClaimsLost),

		Compensated:         m.NewCounter(metricCompensated),
		CompensationWaiting: m.NewGauge(metricCompWaiting),
		Frozen:              m.NewGauge(metricFrozen),
		OrderRepairs:        m.NewCounter(metricOrderRepairs),
	}
	// Every series at 0 from the start (internal/metricseries).
	for _, c := range []*service.MetricCounter{dm.Claimed, dm.Direct, dm.Renewed, dm.Lost, dm.Compensated, dm.OrderRepairs} {
		metricseries.Counter(c)
	}
	for _, g := range []*service.MetricGauge{dm.BatchSize, dm.CompensationWaiting, dm.Frozen} {
		g.Set(0)
	}
	in.d, err = dispatch.NewDispatcher(hub, cfg, mgr.Logger(), dm)
	if err != nil {
		return nil, err
	}
	in.hub = hub
	in.shutdown = shutdownlog.New(in.log, shutdownlog.Interval, in.inFlight)
	return in, nil
}

// inFlight describes the rows handed to the pipeline and not settled yet,
// "" when there are none.
func (in *outboxRetry) inFlight() string {
	l := in.d.Ledger()
	n := l.Held() - l.Queued()
	if n <= 0 {
		return ""
	}
	return plural.Count(n, "row", "rows") + " handed out by the dispatcher to be mapped, sent to the platform and recorded " +
		"(no new claims; unsent claims are given back once they are done)"
}

// Connect connects the dispatcher and makes sure the partitions of now and
// ahead exist; the first time, it also starts the upkeep of partitions and
// the retention.
func (in *outboxRetry) Connect(ctx context.Context) error {
	if err := in.d.Connect(ctx); err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.upkeep == nil {
		in.upkeep = newMaintenance(in.width, in.retention, in.d.Pool(), in.hub.DirectConfig(), in.log)
	}
	if n, err := in.upkeep.ensure(ctx); err != nil {
		return err
	} else if n > 0 {
		in.log.Infof("Partitions: created %d partitions of %s ahead", n, outboxdb.FormatDuration(in.width))
	}
	if !in.started {
		in.upkeep.start()
		in.started = true
	}
	return nil
}

// ReadBatch hands out the next rows of the dispatcher as one batch; its ack
// settles their claims (see dispatch.Dispatcher.Done).
func (in *outboxRetry) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	rows, err := in.d.Next(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// The engine stops reading: shutdown has begun.
			in.shutdown.Start()
		}
		return nil, nil, err
	}
	refs := make([]outboxdb.ClaimRef, len(rows))
	batch := make(service.MessageBatch, len(rows))
	for i, r := range rows {
		refs[i] = r.Ref()
		batch[i] = newMessage(r)
	}
	ack := service.AckFunc(func(ctx context.Context, ackErr error) error {
		return in.d.Done(ctx, refs, ackErr)
	})
	if in.tracer != nil {
		ack = traceClaims(in.tracer, rows, batch, ack)
	}
	return batch, ack, nil
}

func newMessage(r outboxdb.Record) *service.Message {
	msg := service.NewMessage(r.Payload)
	msgmeta.SetClaim(msg, msgmeta.ClaimOf(r))
	return msg
}

// Close stops the upkeep and closes the dispatcher, which gives back every
// claim still held.
func (in *outboxRetry) Close(ctx context.Context) error {
	in.shutdown.Stop()
	in.mu.Lock()
	upkeep := in.upkeep
	in.mu.Unlock()
	if upkeep != nil {
		upkeep.close()
	}
	return in.d.Close(ctx)
}
