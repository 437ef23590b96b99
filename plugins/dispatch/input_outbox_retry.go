// Package dispatch provides the outbox_retry input: the dispatcher that
// claims due outbox rows (new ones, retries and abandoned claims) and hands
// them to the pipeline.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/handoff"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

const (
	orFieldDSN          = "dsn"
	orFieldBatchSize    = "batch_size"
	orFieldLease        = "lease"
	orFieldPollInterval = "poll_interval"
	orFieldInstanceID   = "instance_id"
	orFieldMaxUnacked   = "max_unacked"
	orFieldMaxAttempts  = "max_attempts"
	orFieldNackDelay    = "nack_delay"
	orFieldRetention    = "retention"

	orFieldRetentionOlderThan = "older_than"
	orFieldRetentionInterval  = "interval"
	orFieldRetentionBatchSize = "batch_size"
)

// Metadata keys set on every message (docs/components.md; the output reads
// them by these names).
const (
	metaOutboxID         = "outbox_id"
	metaMessageKey       = "message_key"
	metaAPIType          = "api_type"
	metaAttempt          = "attempt"
	metaClaimToken       = "claim_token"
	metaKafkaTopic       = "kafka_topic"
	metaKafkaPartition   = "kafka_partition"
	metaKafkaOffset      = "kafka_offset"
	metaKafkaKey         = "kafka_key"
	metaCreatedAtMs      = "outbox_created_at_ms"
	metaLeaseExpiresAtMs = "lease_expires_at_ms"
)

// Metric names (docs/components.md).
const (
	metricClaimedRows    = "forwarder_claimed_rows_total"
	metricClaimBatchSize = "forwarder_claim_batch_size"
	metricDirectRows     = "forwarder_direct_rows_total"
)

const (
	// claimTimeout bounds one claim statement. The statement runs detached
	// from ReadBatch's context (see claim), so this is what stops it.
	claimTimeout = 10 * time.Second
	// claimGrace is how long a claim already sent may still finish after
	// shutdown began, so that its rows are known and can be released.
	claimGrace = 2 * time.Second
	// releaseTimeout bounds a release at nack or shutdown.
	releaseTimeout = 10 * time.Second
	// minIdleWait is the shortest wait when a row is due but another
	// dispatcher holds it locked this instant; it doubles while that lasts.
	minIdleWait = 10 * time.Millisecond
)

func outboxRetrySpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Categories("Services").
		Summary("Claims due rows of the PostgreSQL outbox and emits them as messages, on any number of instances at once.").
		Description(`
The dispatcher of the forwarder. Each read claims up to `+"`batch_size`"+` due rows of
`+"`forward_records`"+` in one statement: `+"`PENDING`"+` rows whose `+"`next_retry_at`"+` has come and
`+"`IN_PROGRESS`"+` rows whose lease expired because their holder vanished, oldest due first,
with `+"`FOR UPDATE SKIP LOCKED`"+` so that instances never take the same row. A claimed row becomes
`+"`IN_PROGRESS`"+` with a fresh `+"`claim_token`"+`, a lease deadline and `+"`attempt_count + 1`"+`
(every claim counts as an attempt). A row whose lease expired leaves a `+"`LEASE_EXPIRED`"+` attempt
log; one that has already used `+"`max_attempts`"+` is marked `+"`FAILED`"+` instead of being sent again,
so a message that crashes its holder every time still ends.

The message body is the stored payload, byte for byte. Metadata: `+"`outbox_id`"+`, `+"`message_key`"+`,
`+"`api_type`"+`, `+"`attempt`"+` (this attempt's number, 1-based), `+"`claim_token`"+`, `+"`kafka_topic`"+`,
`+"`kafka_partition`"+`, `+"`kafka_offset`"+`, `+"`kafka_key`"+`, `+"`outbox_created_at_ms`"+` and
`+"`lease_expires_at_ms`"+` (Unix milliseconds).

### Wake-up

The input LISTENs on the channel the `+"`outbox`"+` processor notifies when it commits new PENDING rows,
so such a row is claimed within milliseconds. It claims only while rows may be due: at start, after a
notification, after a claim that filled its batch, after a nack, and when the earliest `+"`next_retry_at`"+`
(a retry or a lease deadline, read once per idle period) or `+"`poll_interval`"+` comes; an `+"`http_forwarder`"+`
of the same process announces the retries it schedules. A claim that finds fewer rows than it asked for
ends the claiming until one of these. The listening connection is re-established, with backoff, whenever
it is lost.

### Direct dispatch

While connected, the input registers itself for its `+"`dsn`"+` in the process. An `+"`outbox`"+` processor of the
same process and `+"`dsn`"+` then inserts new rows already claimed for it, as many as `+"`max_unacked`"+` leaves
room for, and hands them over in memory: they are emitted like claimed rows (same metadata, attempt 1)
without a claim statement, and counted in `+"`forwarder_direct_rows_total`"+`. While due rows of the database
wait for room, no rows are handed over, so retries are not starved by new traffic.

### Acknowledgements

The output writes each row's outcome itself, fenced by `+"`outbox_id`"+` and `+"`claim_token`"+`, before it
acks. On a nack the batch's rows that are still held go back to `+"`PENDING`"+` at once (after
`+"`nack_delay`"+`), instead of waiting for the lease. On shutdown every claim not yet acknowledged is
released the same way, so a graceful stop leaves nothing `+"`IN_PROGRESS`"+`.

`+"`max_unacked`"+` bounds the rows claimed but not yet acknowledged. Keep it small enough that the
pipeline finishes them well within `+"`lease`"+`: a row still queued when its lease runs out may be
claimed by another instance (its late result is then ignored, thanks to the fence).

### Retention

With `+"`retention.older_than`"+` set, the input also deletes `+"`SUCCESS`"+` rows delivered (`+"`succeeded_at`"+`) longer
ago than that, with their attempt logs, once at start and then every `+"`retention.interval`"+`: what
`+"`forwarder outbox purge --older-than`"+` does, in batches of one short transaction each, so it is safe
while the service runs. `+"`PENDING`"+`, `+"`IN_PROGRESS`"+` and `+"`FAILED`"+` rows are never deleted. Of several
instances configured alike, one purges at a time: each run first takes a PostgreSQL advisory lock
(`+"`pg_try_advisory_lock`"+`) and skips its turn when another instance holds it. What a run deleted is
logged at INFO level.

A message that Kafka redelivers after its row was purged is persisted and sent again (the platform
answers "duplicate"), so keep `+"`older_than`"+` longer than the topics' retention when that matters.

### Metrics

`+"`forwarder_claimed_rows_total`"+` (counter) and `+"`forwarder_claim_batch_size`"+` (gauge, rows taken
by the last claim).`).
		Fields(
			service.NewStringField(orFieldDSN).
				Description("PostgreSQL connection string, a libpq URL or key=value string. Never logged.").
				Example("${DATABASE_URL}").
				Secret(),
			service.NewIntField(orFieldBatchSize).
				Description("Most rows claimed by one statement and emitted as one batch.").
				Default(100),
			service.NewDurationField(orFieldLease).
				Description("How long a claimed row stays owned without a result. After it the row is due again for any instance, with a `LEASE_EXPIRED` attempt log. Must exceed the time the pipeline needs for one row, including the output's request timeout.").
				Default("60s").
				Example("${CLAIM_LEASE:60s}"),
			service.NewDurationField(orFieldPollInterval).
				Description("Longest sleep with nothing due. Only a fallback: new rows wake the input through LISTEN/NOTIFY and retries are awaited until their `next_retry_at`.").
				Default("5s"),
			service.NewStringField(orFieldInstanceID).
				Description("Identifies this instance in `claimed_by` and in attempt logs. Empty: `<hostname>-<pid>`.").
				Default(""),
			service.NewIntField(orFieldMaxUnacked).
				Description("Most rows claimed and not yet acknowledged; the input stops claiming while it holds this many. Every held row's lease is running, so keep it below what the output finishes within one lease when the platform hangs: `max_in_flight × lease / timeout` of the output (100 × 60s / 10s = 600 with the defaults).").
				Default(300),
			service.NewIntField(orFieldMaxAttempts).
				Description("Attempts a row may use. A due row that has already used them (its last holder vanished, or it was released on its last attempt) is marked `FAILED` instead of being sent again. Use the same value as the output's `retry.max_attempts`.").
				Default(5).
				Example("${FORWARD_MAX_ATTEMPTS:5}"),
			service.NewDurationField(orFieldNackDelay).
				Description("How long a nacked row waits before it is due again. `0s`: at once.").
				Default("0s").
				Advanced(),
			service.NewObjectField(orFieldRetention,
				service.NewStringField(orFieldRetentionOlderThan).
					Description("Deletes `SUCCESS` rows delivered longer ago than this, with their attempt logs. Go duration syntax plus days (`7d`, `36h`, `1d12h`). Empty: no periodic cleaning.").
					Default("").
					Examples("7d", "${OUTBOX_RETENTION:}"),
				service.NewStringField(orFieldRetentionInterval).
					Description("Time between two cleaning runs; the first runs when the input connects. Go duration syntax plus days.").
					Default("1h"),
				service.NewIntField(orFieldRetentionBatchSize).
					Description("Rows deleted per transaction: small enough that each holds its locks briefly while the service runs.").
					Default(outboxdb.DefaultAdminBatchSize),
			).
				Description("An optional periodic cleaner of delivered rows (see Retention above). Off unless `older_than` is set."),
		).
		Example("Dispatcher", "Claims due rows and hands them to the mapping and the HTTP output.", `
input:
  outbox_retry:
    dsn: ${DATABASE_URL}
    batch_size: 100
    lease: ${CLAIM_LEASE:60s}
    poll_interval: 5s
    max_unacked: 300
    max_attempts: ${FORWARD_MAX_ATTEMPTS:5}
`).
		Example("Dispatcher with retention", "Also deletes rows delivered more than a week ago, checking every hour; one instance purges at a time.", `
input:
  outbox_retry:
    dsn: ${DATABASE_URL}
    max_attempts: ${FORWARD_MAX_ATTEMPTS:5}
    retention:
      older_than: 7d
      interval: 1h
      batch_size: 5000
`)
}

func init() {
	service.MustRegisterBatchInput("outbox_retry", outboxRetrySpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
			return newOutboxRetryFromParsed(conf, mgr)
		})
}

// outboxRetry is the outbox_retry input.
type outboxRetry struct {
	dsn          string
	batchSize    int
	lease        time.Duration
	pollInterval time.Duration
	instanceID   string
	maxUnacked   int
	maxAttempts  int
	nackDelay    time.Duration
	// retention is nil unless retention.older_than is set.
	retention *retentionConfig

	listenConf *outboxdb.ListenerConfig
	log        *service.Logger
	mClaimed   *service.MetricCounter
	mBatchSize *service.MetricGauge
	mDirect    *service.MetricCounter

	// acked receives a value after every ack or nack: capacity may have come
	// back.
	acked chan struct{}
	// nudge receives a value when rows were handed over or a retry was
	// scheduled (see handoff).
	nudge chan struct{}
	// claimNeeded is set while rows may be due in the database: at start, on
	// a notification, when a claim filled its limit, when the next due time
	// comes, after a nack. A claim that takes less than it asked for clears
	// it: the input then waits instead of claiming again, so a steady flow of
	// handed-over rows costs no claim statements.
	claimNeeded atomic.Bool

	// Only ReadBatch uses these; the engine never calls it concurrently.
	// idleWait grows while rows are due but locked by someone else; dueAt is
	// when the next row is due (from NextDue), valid while dueKnown.
	idleWait time.Duration
	dueAt    time.Time
	dueKnown bool

	mu       sync.Mutex
	pool     *pgxpool.Pool
	listener *outboxdb.Listener
	cleaner  *retention
	stopL    context.CancelFunc
	lDone    chan struct{}
	// held maps the id of every row claimed (or handed over) and not yet
	// acknowledged to its claim token.
	held   map[int64]string
	closed bool
	// Handed over by the outbox processor (see handoff): reserved slots not
	// yet delivered, delivered rows not yet emitted (they are in held), and
	// the earliest retry the output announced.
	reserved    int
	queue       []outboxdb.ClaimedRow
	hintAt      time.Time
	waitForRoom bool
	unregister  func()

	// Test hooks, set before Connect: onListen runs after every LISTEN,
	// onIdle when ReadBatch starts waiting with nothing due, onClaim before
	// every claim statement.
	onListen, onIdle, onClaim func()
}

func newOutboxRetryFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*outboxRetry, error) {
	in := &outboxRetry{
		log:        mgr.Logger(),
		mClaimed:   mgr.Metrics().NewCounter(metricClaimedRows),
		mBatchSize: mgr.Metrics().NewGauge(metricClaimBatchSize),
		mDirect:    mgr.Metrics().NewCounter(metricDirectRows),
		acked:      make(chan struct{}, 1),
		nudge:      make(chan struct{}, 1),
		held:       map[int64]string{},
	}
	in.claimNeeded.Store(true)
	var err error
	if in.dsn, err = conf.FieldString(orFieldDSN); err != nil {
		return nil, err
	}
	if in.batchSize, err = conf.FieldInt(orFieldBatchSize); err != nil {
		return nil, err
	}
	if in.lease, err = conf.FieldDuration(orFieldLease); err != nil {
		return nil, err
	}
	if in.pollInterval, err = conf.FieldDuration(orFieldPollInterval); err != nil {
		return nil, err
	}
	if in.instanceID, err = conf.FieldString(orFieldInstanceID); err != nil {
		return nil, err
	}
	if in.maxUnacked, err = conf.FieldInt(orFieldMaxUnacked); err != nil {
		return nil, err
	}
	if in.maxAttempts, err = conf.FieldInt(orFieldMaxAttempts); err != nil {
		return nil, err
	}
	if in.nackDelay, err = conf.FieldDuration(orFieldNackDelay); err != nil {
		return nil, err
	}

	switch {
	case in.batchSize < 1:
		return nil, fmt.Errorf("field %s: %d must be at least 1", orFieldBatchSize, in.batchSize)
	case in.lease < time.Second:
		return nil, fmt.Errorf("field %s: %v must be at least 1s", orFieldLease, in.lease)
	case in.pollInterval <= 0:
		return nil, fmt.Errorf("field %s: %v must be positive", orFieldPollInterval, in.pollInterval)
	case in.maxUnacked < 1:
		return nil, fmt.Errorf("field %s: %d must be at least 1", orFieldMaxUnacked, in.maxUnacked)
	case in.maxAttempts < 1:
		return nil, fmt.Errorf("field %s: %d must be at least 1", orFieldMaxAttempts, in.maxAttempts)
	case in.nackDelay < 0:
		return nil, fmt.Errorf("field %s: %v must not be negative", orFieldNackDelay, in.nackDelay)
	}
	if in.retention, err = parseRetention(conf.Namespace(orFieldRetention)); err != nil {
		return nil, err
	}
	if in.instanceID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "forwarder"
		}
		in.instanceID = host + "-" + strconv.Itoa(os.Getpid())
	}

	// Parse now so that a bad DSN fails at config time, without network.
	pcfg, err := outboxdb.ParsePoolConfig(in.dsn, outboxdb.PoolConfig{ApplicationName: "forwarder outbox_retry"})
	if err != nil {
		return nil, fmt.Errorf("field %s: %w", orFieldDSN, err)
	}
	in.listenConf = &outboxdb.ListenerConfig{ConnConfig: pcfg.ConnConfig}
	return in, nil
}

// Connect opens the pool and starts the listener; called again after a lost
// connection it only checks the database is back.
func (in *outboxRetry) Connect(ctx context.Context) error {
	in.mu.Lock()
	pool, closed := in.pool, in.closed
	in.mu.Unlock()
	if closed {
		return service.ErrEndOfInput
	}
	if pool != nil {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("reconnecting to the outbox database: %w", err)
		}
		return nil
	}
	maxConns := int32(4)
	if in.retention != nil {
		maxConns++ // a purge holds one for its whole run
	}
	pool, err := outboxdb.OpenMigrated(ctx, in.dsn, outboxdb.PoolConfig{MaxConns: maxConns, ApplicationName: "forwarder outbox_retry", NoSeqScan: true})
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		pool.Close()
		return service.ErrEndOfInput
	}
	in.pool = pool

	lc := *in.listenConf
	lc.OnListen = func() {
		in.log.Debugf("Listening for new outbox rows on channel %s", outboxdb.NotifyChannel)
		if in.onListen != nil {
			in.onListen()
		}
	}
	lc.OnError = func(err error) {
		in.log.Warnf("Lost the notification connection, reconnecting with backoff (new rows are found by polling meanwhile): %v", err)
	}
	in.listener = outboxdb.NewListener(lc)
	// The listener outlives Connect's context: it runs until Close.
	lctx, stop := context.WithCancel(context.Background())
	done, listener := make(chan struct{}), in.listener
	in.stopL, in.lDone = stop, done
	go func() {
		defer close(done)
		listener.Run(lctx)
	}()
	if in.retention != nil {
		in.cleaner = newRetention(*in.retention, pool, in.log)
		in.cleaner.start()
	}
	in.unregister = handoff.Register(in.dsn, in)
	return nil
}

// ReadBatch returns the rows handed over by the outbox processor, or else
// claims due rows, as one batch. With nothing to emit it waits for rows to
// be handed over, a notification, the next due time or the poll interval
// (see waitForWork), and for room when max_unacked rows are held; it returns
// when ctx is cancelled.
func (in *outboxRetry) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	in.mu.Lock()
	pool, listener, closed := in.pool, in.listener, in.closed
	in.mu.Unlock()
	if closed {
		return nil, nil, service.ErrEndOfInput
	}
	if pool == nil {
		return nil, nil, service.ErrNotConnected
	}
	for {
		if rows := in.dequeue(); len(rows) > 0 {
			return in.emit(ctx, pool, rows)
		}
		if !in.claimNeeded.Load() {
			if err := in.waitForWork(ctx, pool, listener); err != nil {
				return nil, nil, err
			}
			continue
		}
		room := in.room()
		if room == 0 {
			in.setWaitForRoom(true)
			select {
			case <-in.acked:
			case <-in.nudge:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			continue
		}
		in.setWaitForRoom(false)
		// Wake-ups that arrive from here on may concern rows this claim
		// does not see: they set claimNeeded again.
		drain(listener.Wake())
		in.claimNeeded.Store(false)
		in.dueKnown = false

		res, err := in.claim(ctx, pool, room)
		if err != nil {
			in.claimNeeded.Store(true)
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if pingErr := pool.Ping(ctx); pingErr != nil {
				in.log.Warnf("Outbox database unreachable, reconnecting: %v", pingErr)
				return nil, nil, service.ErrNotConnected
			}
			return nil, nil, err
		}
		if len(res.Claimed)+len(res.Exhausted) >= room {
			in.claimNeeded.Store(true) // more may be due behind these
		}
		if len(res.Exhausted) > 0 {
			in.logExhausted(res.Exhausted)
		}
		if len(res.Claimed) > 0 {
			in.idleWait = 0
			return in.emit(ctx, pool, res.Claimed)
		}
	}
}

// claim runs one claim statement and records what it took in held before
// anything else can happen, so that no claimed row is ever forgotten.
//
// The statement runs detached from ctx: cancelling a statement that has
// already committed would lose the claim tokens, leaving the rows
// IN_PROGRESS until their lease runs out. A claim under way when shutdown
// begins gets claimGrace to finish; its rows are then released by emit.
func (in *outboxRetry) claim(ctx context.Context, pool *pgxpool.Pool, limit int) (outboxdb.ClaimResult, error) {
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(claimGrace, cancel) })
	defer stop()
	if in.onClaim != nil {
		in.onClaim()
	}

	res, err := outboxdb.ClaimDue(claimCtx, pool, outboxdb.ClaimParams{
		Limit:       limit,
		Lease:       in.lease,
		Claimer:     in.instanceID,
		MaxAttempts: in.maxAttempts,
	})
	if err != nil {
		return res, err
	}
	in.mu.Lock()
	for _, r := range res.Claimed {
		in.held[r.ID] = r.ClaimToken
	}
	in.mu.Unlock()
	in.mClaimed.Incr(int64(len(res.Claimed)))
	in.mBatchSize.Set(int64(len(res.Claimed)))
	return res, nil
}

// emit turns claimed rows into a batch. If shutdown began meanwhile the rows
// are released unsent instead: the engine would drop the batch unread.
func (in *outboxRetry) emit(ctx context.Context, pool *pgxpool.Pool, rows []outboxdb.ClaimedRow) (service.MessageBatch, service.AckFunc, error) {
	refs := make([]outboxdb.ClaimRef, len(rows))
	batch := make(service.MessageBatch, len(rows))
	for i, r := range rows {
		refs[i] = r.Ref()
		batch[i] = newMessage(r)
	}
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if _, err := outboxdb.ReleaseUnsent(rctx, pool, refs); err != nil {
			// Close tries again; failing that, the lease brings them back.
			in.log.Errorf("Could not release %d rows claimed during shutdown: %v", len(refs), err)
		} else {
			in.forget(refs)
		}
		return nil, nil, ctx.Err()
	}
	return batch, in.ackFunc(pool, refs), nil
}

func newMessage(r outboxdb.ClaimedRow) *service.Message {
	msg := service.NewMessage(r.Payload)
	msg.MetaSetMut(metaOutboxID, r.ID)
	msg.MetaSetMut(metaMessageKey, r.MessageKey)
	msg.MetaSetMut(metaAPIType, r.APIType)
	msg.MetaSetMut(metaAttempt, int64(r.AttemptCount))
	msg.MetaSetMut(metaClaimToken, r.ClaimToken)
	msg.MetaSetMut(metaKafkaTopic, r.KafkaTopic)
	msg.MetaSetMut(metaKafkaPartition, int64(r.KafkaPartition))
	msg.MetaSetMut(metaKafkaOffset, r.KafkaOffset)
	msg.MetaSetMut(metaKafkaKey, string(r.KafkaKey))
	msg.MetaSetMut(metaCreatedAtMs, r.CreatedAt.UnixMilli())
	msg.MetaSetMut(metaLeaseExpiresAtMs, r.LeaseExpiresAt.UnixMilli())
	return msg
}

// ackFunc handles the outcome of one batch. On an ack the output has written
// every row's result already, so the rows are only forgotten. On a nack the
// rows still held (no result written) go back to PENDING at once: releasing
// is fenced by claim token and status, so rows whose result was written, in a
// partly failed batch, are left alone.
func (in *outboxRetry) ackFunc(pool *pgxpool.Pool, refs []outboxdb.ClaimRef) service.AckFunc {
	return func(ctx context.Context, ackErr error) error {
		defer in.signalAcked()
		if ackErr == nil {
			in.forget(refs)
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		n, err := outboxdb.Release(rctx, pool, refs, in.nackDelay, "nacked: "+ackErr.Error())
		if in.nackDelay == 0 {
			in.claimNeeded.Store(true)
		} else {
			in.DueAt(time.Now().Add(in.nackDelay))
		}
		// Forget the rows even when the release failed (the database is
		// likely down): their lease brings them back and the claim token
		// fences any late write, whereas keeping them counted against
		// max_unacked would stop this input claiming for good once an
		// outage had nacked max_unacked rows.
		in.forget(refs)
		if err != nil {
			return fmt.Errorf("releasing %d nacked rows (they come back when their lease expires): %w", len(refs), err)
		}
		in.log.Debugf("Released %d of %d nacked rows: %v", n, len(refs), ackErr)
		return nil
	}
}

// waitForWork sleeps until rows may be due in the database (a notification,
// the next due time, the poll interval) or rows are handed over, and says
// which by setting claimNeeded. The next due time is read once per idle
// period, not per wake-up.
func (in *outboxRetry) waitForWork(ctx context.Context, pool *pgxpool.Pool, listener *outboxdb.Listener) error {
	now := time.Now()
	if !in.dueKnown {
		in.dueKnown = true
		in.dueAt = now.Add(in.pollInterval)
		due, ok, err := outboxdb.NextDue(ctx, pool)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			in.log.Debugf("Could not read the next due time, polling: %v", err)
		case ok && due <= 0:
			// Due but locked by another claimer or a result being written.
			in.idleWait = min(max(in.idleWait*2, minIdleWait), in.pollInterval)
			in.dueAt = now.Add(in.idleWait)
		case ok:
			in.idleWait = 0
			in.dueAt = now.Add(min(due, in.pollInterval))
		}
	}
	if hint := in.takeHint(); !hint.IsZero() && hint.Before(in.dueAt) {
		in.dueAt = hint
	}
	t := time.NewTimer(max(in.dueAt.Sub(now), 0))
	defer t.Stop()
	if in.onIdle != nil {
		in.onIdle()
	}
	select {
	case <-listener.Wake():
		in.claimNeeded.Store(true)
	case <-t.C:
		in.claimNeeded.Store(true)
	case <-in.nudge:
		// Rows handed over, or an earlier due time: the caller looks again.
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Close releases every claim not yet acknowledged, stops the listener and
// closes the pool. The engine calls it once pending acks have resolved, so
// what is still held here was either dropped by the engine at shutdown or is
// still in flight after a forced stop: either way it goes back to PENDING
// (its result, if one is written later, is fenced out).
func (in *outboxRetry) Close(ctx context.Context) error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	pool, stop, done, cleaner := in.pool, in.stopL, in.lDone, in.cleaner
	if in.unregister != nil {
		in.unregister()
	}
	// Rows handed over but never emitted go back as if never claimed; the
	// rest may have reached the platform, so their attempt stands.
	unsent := make([]outboxdb.ClaimRef, 0, len(in.queue))
	queued := make(map[int64]bool, len(in.queue))
	for _, r := range in.queue {
		unsent = append(unsent, r.Ref())
		queued[r.ID] = true
	}
	in.queue = nil
	refs := make([]outboxdb.ClaimRef, 0, len(in.held))
	for id, token := range in.held {
		if !queued[id] {
			refs = append(refs, outboxdb.ClaimRef{ID: id, ClaimToken: token})
		}
	}
	in.mu.Unlock()

	if stop != nil {
		stop()
		<-done
	}
	if cleaner != nil {
		cleaner.close()
	}
	if pool == nil {
		return nil
	}
	defer pool.Close()
	if len(refs)+len(unsent) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	var errs []error
	if len(unsent) > 0 {
		if _, err := outboxdb.ReleaseUnsent(rctx, pool, unsent); err != nil {
			errs = append(errs, fmt.Errorf("giving back %d rows handed over but never sent: %w", len(unsent), err))
		} else {
			in.forget(unsent)
		}
	}
	if len(refs) > 0 {
		if n, err := outboxdb.Release(rctx, pool, refs, 0, "released at shutdown without a result"); err != nil {
			errs = append(errs, fmt.Errorf("releasing %d claimed rows: %w", len(refs), err))
		} else {
			in.forget(refs)
			in.log.Infof("Released %d claimed rows at shutdown", n)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("at shutdown (the rows come back when their lease expires): %w", err)
	}
	return nil
}

// room is how many more rows may be claimed now.
func (in *outboxRetry) room() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return max(min(in.batchSize, in.maxUnacked-len(in.held)-in.reserved), 0)
}

// setWaitForRoom says whether ReadBatch waits for room to claim due rows:
// meanwhile the outbox processor gets no reservations, so that rows due in
// the database (retries, released and expired claims) are not starved by a
// steady flow of new ones.
func (in *outboxRetry) setWaitForRoom(v bool) {
	in.mu.Lock()
	in.waitForRoom = v
	in.mu.Unlock()
}

// dequeue takes up to batchSize handed-over rows.
func (in *outboxRetry) dequeue() []outboxdb.ClaimedRow {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := min(len(in.queue), in.batchSize)
	if n == 0 {
		return nil
	}
	rows := in.queue[:n:n]
	in.queue = in.queue[n:]
	if len(in.queue) == 0 {
		in.queue = nil
	}
	return rows
}

func (in *outboxRetry) takeHint() time.Time {
	in.mu.Lock()
	defer in.mu.Unlock()
	t := in.hintAt
	in.hintAt = time.Time{}
	return t
}

// Claim implements handoff.Dispatcher.
func (in *outboxRetry) Claim() outboxdb.DirectClaim {
	return outboxdb.DirectClaim{Lease: in.lease, Claimer: in.instanceID}
}

// Reserve implements handoff.Dispatcher.
func (in *outboxRetry) Reserve(n int) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || in.waitForRoom || n <= 0 {
		return 0
	}
	g := max(min(n, in.maxUnacked-len(in.held)-in.reserved), 0)
	in.reserved += g
	return g
}

// Deliver implements handoff.Dispatcher: the rows join held at once, so
// that Close releases them whether or not they were emitted.
func (in *outboxRetry) Deliver(granted int, rows []outboxdb.ClaimedRow) bool {
	in.mu.Lock()
	in.reserved -= granted
	if in.closed {
		in.mu.Unlock()
		return false
	}
	for _, r := range rows {
		in.held[r.ID] = r.ClaimToken
	}
	in.queue = append(in.queue, rows...)
	in.mu.Unlock()
	if len(rows) > 0 {
		in.mDirect.Incr(int64(len(rows)))
	}
	in.signal(in.nudge)
	return true
}

// DueAt implements handoff.Dispatcher.
func (in *outboxRetry) DueAt(t time.Time) {
	in.mu.Lock()
	if in.hintAt.IsZero() || t.Before(in.hintAt) {
		in.hintAt = t
	}
	in.mu.Unlock()
	in.signal(in.nudge)
}

func (in *outboxRetry) forget(refs []outboxdb.ClaimRef) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, r := range refs {
		if in.held[r.ID] == r.ClaimToken {
			delete(in.held, r.ID)
		}
	}
}

func (in *outboxRetry) signalAcked() { in.signal(in.acked) }

func (in *outboxRetry) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (in *outboxRetry) logExhausted(rows []outboxdb.ExhaustedRow) {
	const show = 10
	ids := make([]int64, 0, min(len(rows), show))
	for _, r := range rows[:min(len(rows), show)] {
		ids = append(ids, r.ID)
	}
	in.log.Warnf("Marked %d due rows FAILED: out of attempts (max_attempts %d); ids %v; first: %s",
		len(rows), in.maxAttempts, ids, rows[0].LastError)
}

func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// parseRetention reads the retention block; nil when older_than is empty.
func parseRetention(conf *service.ParsedConfig) (*retentionConfig, error) {
	olderThan, err := conf.FieldString(orFieldRetentionOlderThan)
	if err != nil {
		return nil, err
	}
	if olderThan == "" {
		return nil, nil
	}
	field := func(name string) string { return orFieldRetention + "." + name }
	var rc retentionConfig
	if rc.OlderThan, err = outboxdb.ParseDuration(olderThan); err != nil {
		return nil, fmt.Errorf("field %s: %w", field(orFieldRetentionOlderThan), err)
	}
	interval, err := conf.FieldString(orFieldRetentionInterval)
	if err != nil {
		return nil, err
	}
	if rc.Interval, err = outboxdb.ParseDuration(interval); err != nil {
		return nil, fmt.Errorf("field %s: %w", field(orFieldRetentionInterval), err)
	}
	if rc.Interval <= 0 {
		return nil, fmt.Errorf("field %s: %q must be positive", field(orFieldRetentionInterval), interval)
	}
	if rc.BatchSize, err = conf.FieldInt(orFieldRetentionBatchSize); err != nil {
		return nil, err
	}
	if rc.BatchSize < 1 {
		return nil, fmt.Errorf("field %s: %d must be at least 1", field(orFieldRetentionBatchSize), rc.BatchSize)
	}
	return &rc, nil
}
