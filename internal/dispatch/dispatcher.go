package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/internal/protection"
)

// DispatcherConfig configures a Dispatcher. Zero values take the defaults
// given.
type DispatcherConfig struct {
	// BatchSize caps the rows of one claim and of one batch handed out.
	// Default 100.
	BatchSize int
	// Lease is how long a claim owns its row without a result; the
	// dispatcher renews the leases of rows it holds, so it bounds what a
	// crash costs rather than how long a row may take. Default 60s.
	Lease time.Duration
	// PollInterval is the longest sleep with nothing known to be due.
	// Default 5s.
	PollInterval time.Duration
	// Claimer names this dispatcher in claimed_by and attempt logs.
	Claimer string
	// MaxUnacked bounds the rows held; MaxUnackedBytes their payload bytes
	// (0: no byte bound). Defaults 300 and 0.
	MaxUnacked      int
	MaxUnackedBytes int64
	// MaxDirect is how many rows may be held for new rows still to be
	// handed over at insert (direct dispatch); past it they are inserted
	// due, for any instance to claim. Default and upper bound: MaxUnacked.
	MaxDirect int
	// MaxAttempts, when set, is the attempts a row may use; otherwise the
	// output's (Output.MaxAttempts), else 5.
	MaxAttempts int
	// NackDelay is how long a nacked row waits before it is due again.
	NackDelay time.Duration
	// Compensation requeues rows FAILED on transient errors.
	Compensation CompensationConfig
	// OrderOnFailed is what a row with an ordering key that ends FAILED
	// does to the rows of its key held behind it: release the next one
	// (outboxdb.OrderSkip, the default) or keep the key blocked
	// (outboxdb.OrderBlock). The output of the stream reads it here.
	OrderOnFailed outboxdb.OrderOnFailed
}

func (c DispatcherConfig) withDefaults() DispatcherConfig {
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.Lease = cmp.Or(c.Lease, 60*time.Second)
	c.PollInterval = cmp.Or(c.PollInterval, 5*time.Second)
	c.MaxUnacked = cmp.Or(c.MaxUnacked, 300)
	c.OrderOnFailed = cmp.Or(c.OrderOnFailed, outboxdb.OrderSkip)
	return c
}

const (
	// claimTimeout bounds one claim statement. The statement runs detached
	// from the caller's context (see claim), so this is what stops it.
	claimTimeout = 10 * time.Second
	// claimGrace is how long a claim already sent may still finish after
	// shutdown began, so that its rows are known and can be released.
	claimGrace = 2 * time.Second
	// releaseTimeout bounds a release at nack or shutdown.
	releaseTimeout = 10 * time.Second
	// minIdleWait is the shortest wait when a row is due but another
	// dispatcher holds it locked this instant; it doubles while that lasts.
	minIdleWait = 10 * time.Millisecond
	// idleNoticeInterval is the most often a dispatcher that finds nothing
	// due tells the others (outboxdb.AnnounceIdle), and peerIdleFor how
	// long a dispatcher that heard it releases the rows its results free
	// as due rather than claiming them itself (Ledger.PeerIdle).
	idleNoticeInterval = time.Second
	peerIdleFor        = 3 * idleNoticeInterval
	// defaultMaxAttempts applies when neither the dispatcher nor an output
	// says.
	defaultMaxAttempts = 5
)

// Metrics the dispatcher reports; nil fields are not reported.
type DispatcherMetrics struct {
	Claimed   *service.MetricCounter // rows claimed
	BatchSize *service.MetricGauge   // rows taken by the last claim
	Direct    *service.MetricCounter // rows handed over by direct dispatch
	Renewed   *service.MetricCounter // leases renewed
	Lost      *service.MetricCounter // claims found lost by a renewal
	// Compensated counts rows requeued by automatic compensation;
	// CompensationWaiting and Frozen are the rows it will still requeue and
	// those it is done with.
	Compensated         *service.MetricCounter
	CompensationWaiting *service.MetricGauge
	Frozen              *service.MetricGauge
	// OrderRepairs counts held rows the ordering repair released (rows
	// nothing held: never expected).
	OrderRepairs *service.MetricCounter
}

// Dispatcher claims due outbox rows and hands them out, together with the
// rows the outbox processor of its stream inserts already claimed for it
// (direct dispatch), and keeps the leases of the rows it holds alive. It is
// the engine of the outbox_retry input, which only turns rows into messages.
//
// It claims only while rows may be due: at start, after a notification,
// after a claim that filled its limit, after a nack, when the earliest
// next_retry_at comes, when the output announces a retry, and at least
// every PollInterval.
type Dispatcher struct {
	hub    *Hub
	cfg    DispatcherConfig
	log    *service.Logger
	m      DispatcherMetrics
	ledger *Ledger
	// dropped logs the rows failed because the pipeline dropped their
	// messages, a line per burst.
	dropped *lograte.Burst

	// acked receives a value after every ack or nack: room may have come back.
	acked chan struct{}
	// nudge receives a value when rows were handed over or a retry was
	// scheduled.
	nudge chan struct{}
	// claimNeeded is set while rows may be due in the database. A claim that
	// takes less than it asked for clears it: the dispatcher then waits
	// instead of claiming again, so a steady flow of handed-over rows costs
	// no claim statements.
	claimNeeded atomic.Bool

	// Only Next uses these (it is never called concurrently).
	idleWait       time.Duration
	dueAt          time.Time
	dueKnown       bool
	lastIdleNotice time.Time

	mu       sync.Mutex
	pool     *pgxpool.Pool
	listener *outboxdb.Listener
	stop     context.CancelFunc
	done     sync.WaitGroup
	loops    []*periodic.Loop
	hintAt   time.Time
	closed   bool
	renewOK  time.Time // when the last renewal succeeded (or had nothing to do)

	// started holds the first claim until the process has started
	// (launch.Process): a SIGTERM before then would kill the process with
	// its claims held.
	started *launch.Gate

	// Test hooks, set before Connect: OnListen runs after every LISTEN,
	// OnIdle when Next starts waiting with nothing due, OnClaim before
	// every claim statement, OnIdleNotice once the listener has taken an
	// idle notice (its own included) with the claimer that sent it.
	OnListen, OnIdle, OnClaim func()
	OnIdleNotice              func(claimer string)
}

// NewDispatcher registers a dispatcher with hub; its settings are checked
// against the output's when both are known. Nothing touches the network.
func NewDispatcher(hub *Hub, cfg DispatcherConfig, log *service.Logger, m DispatcherMetrics) (*Dispatcher, error) {
	cfg = cfg.withDefaults()
	d := &Dispatcher{
		hub:     hub,
		cfg:     cfg,
		log:     log,
		m:       m,
		ledger:  NewLedger(Limits{Rows: cfg.MaxUnacked, Bytes: cfg.MaxUnackedBytes, DirectRows: cfg.MaxDirect}),
		dropped: lograte.New(log, 10*time.Second),
		acked:   make(chan struct{}, 1),
		nudge:   make(chan struct{}, 1),
		started: launch.Process,
	}
	d.claimNeeded.Store(true)
	if err := hub.setDispatcher(d); err != nil {
		return nil, err
	}
	if out := hub.attached(); out != nil {
		if err := checkLease(cfg.Lease, out.Timeout); err != nil {
			hub.dropDispatcher(d)
			return nil, err
		}
	}
	return d, nil
}

// Config returns the dispatcher's settings.
func (d *Dispatcher) Config() DispatcherConfig { return d.cfg }

// RecordOptions are the options of every result write for rows this
// stream dispatches (the ordering policy).
func (d *Dispatcher) RecordOptions() outboxdb.RecordOptions {
	return outboxdb.RecordOptions{OnFailed: d.cfg.OrderOnFailed}
}

// Ledger returns the dispatcher's account of held rows.
func (d *Dispatcher) Ledger() *Ledger { return d.ledger }

// MaxAttempts is the attempts a row may use.
func (d *Dispatcher) MaxAttempts() int {
	if d.cfg.MaxAttempts > 0 {
		return d.cfg.MaxAttempts
	}
	if out := d.hub.attached(); out != nil && out.MaxAttempts > 0 {
		return out.MaxAttempts
	}
	return defaultMaxAttempts
}

// Connect opens the stream's pool (creating or upgrading the schema) and
// starts listening for new rows and renewing leases; called again after a
// lost connection it only checks the database is back.
func (d *Dispatcher) Connect(ctx context.Context) error {
	return d.hub.Connect(ctx, &d.mu, &d.pool, &d.closed, d.startLoops)
}

// startLoops starts, under d.mu, what runs beside a newly opened pool: the
// listener and the renew, repair and compensation loops.
func (d *Dispatcher) startLoops(pool *pgxpool.Pool) {
	d.listener = outboxdb.NewListener(outboxdb.ListenerConfig{
		ConnConfig: d.hub.SessionConfig(),
		OnListen: func() {
			d.log.Debugf("Listening for new outbox rows on channel %s", outboxdb.NotifyChannel)
			if d.OnListen != nil {
				d.OnListen()
			}
		},
		OnNotify: func(payload string) (wake bool) {
			if claimer, ok := outboxdb.IdleNotice(payload); ok {
				if claimer != d.cfg.Claimer {
					d.ledger.PeerIdle(time.Now().Add(peerIdleFor))
				}
				if d.OnIdleNotice != nil {
					d.OnIdleNotice(claimer)
				}
				return false
			}
			if instance, ago, ok := outboxdb.HealthyNotice(payload); ok {
				if g := d.hub.gate(); g != nil {
					g.FollowPeerHealthy(instance, ago)
				}
				return false
			}
			left, ok := outboxdb.PauseNotice(payload)
			if !ok {
				return true
			}
			if g := d.hub.gate(); g != nil {
				g.FollowPause(left)
			}
			return false
		},
		OnError: func(err error) {
			d.log.Warnf("Lost the notification connection, reconnecting with backoff (new rows are found by polling meanwhile): %v", err)
		},
	})
	// The loops outlive Connect's context: they run until Close.
	lctx, stop := context.WithCancel(context.Background())
	d.stop = stop
	d.renewOK = time.Now()
	listener := d.listener
	d.done.Add(1)
	go func() {
		defer d.done.Done()
		listener.Run(lctx)
	}()
	d.loops = []*periodic.Loop{d.renewLoop(lctx, pool), d.orderRepairLoop(lctx, pool)}
	if d.cfg.Compensation.After > 0 && d.cfg.Compensation.Rounds > 0 {
		d.loops = append(d.loops, d.compensationLoop(lctx, pool))
	}
}

// Pool returns the pool once connected, else nil.
func (d *Dispatcher) Pool() *pgxpool.Pool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pool
}

// Next returns the rows handed over by direct dispatch, or else claims due
// rows, as one batch. With nothing to hand out it waits for rows to be
// handed over, a notification, the next due time or the poll interval, and
// for room when the ledger is full; it returns when ctx is cancelled.
// service.ErrNotConnected asks the caller to reconnect;
// service.ErrEndOfInput says the dispatcher was closed.
func (d *Dispatcher) Next(ctx context.Context) ([]outboxdb.Record, error) {
	d.mu.Lock()
	pool, listener, closed := d.pool, d.listener, d.closed
	d.mu.Unlock()
	if closed {
		return nil, service.ErrEndOfInput
	}
	if pool == nil {
		return nil, service.ErrNotConnected
	}
	if err := d.started.Wait(ctx); err != nil {
		return nil, err
	}
	for {
		if rows := d.ledger.Take(d.cfg.BatchSize); len(rows) > 0 {
			return d.handOut(ctx, pool, rows)
		}
		if !d.claimNeeded.Load() {
			if err := d.waitForWork(ctx, pool, listener); err != nil {
				return nil, err
			}
			continue
		}
		if g := d.hub.gate(); g != nil {
			probe, wait, err := d.gated(ctx, pool, g)
			switch {
			case err != nil:
				return nil, err
			case probe != nil:
				return d.handOut(ctx, pool, probe)
			case wait:
				continue
			}
		}
		rows, bytes := d.ledger.Room()
		if rows == 0 || (bytes == 0 && d.ledger.Held() > 0) {
			d.ledger.SetWaitForRoom(true)
			select {
			case <-d.acked:
			case <-d.nudge:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		d.ledger.SetWaitForRoom(false)
		// Wake-ups that arrive from here on may concern rows this claim
		// does not see: they set claimNeeded again.
		drain(listener.Wake())
		d.claimNeeded.Store(false)
		d.dueKnown = false

		limit := min(d.cfg.BatchSize, rows)
		res, err := d.claim(ctx, pool, outboxdb.ClaimParams{Limit: limit, MaxBytes: bytes})
		if err != nil {
			d.claimNeeded.Store(true)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if checkErr := outboxdb.CheckWritable(ctx, pool); checkErr != nil {
				d.log.Warnf("Outbox database unreachable or read-only, reconnecting: %v", checkErr)
				return nil, service.ErrNotConnected
			}
			return nil, err
		}
		if len(res.Claimed)+len(res.Exhausted) >= limit {
			d.claimNeeded.Store(true) // more may be due behind these
		}
		if len(res.Exhausted) > 0 {
			d.logExhausted(res.Exhausted)
		}
		if len(res.Claimed) > 0 {
			d.idleWait = 0
			return d.handOut(ctx, pool, res.Claimed)
		}
		if len(res.Exhausted) == 0 {
			d.announceIdle(ctx, pool)
		}
	}
}

// announceIdle tells the other dispatchers that this one, with room to
// claim, found nothing due, at most once per idleNoticeInterval. They stop
// claiming the rows their result writes release (Ledger.PeerIdle), so a
// backlog of few ordering keys, each claimed by the instance that sent its
// previous row, spreads to this one instead of queueing behind the other's
// requests. It is a hint: a failure is only logged.
func (d *Dispatcher) announceIdle(ctx context.Context, pool *pgxpool.Pool) {
	now := time.Now()
	if now.Sub(d.lastIdleNotice) < idleNoticeInterval {
		return
	}
	d.lastIdleNotice = now
	if err := outboxdb.AnnounceIdle(ctx, pool, d.cfg.Claimer); err != nil && ctx.Err() == nil {
		d.log.Debugf("Could not tell the other instances this one is idle: %v", err)
	}
}

// gated keeps claims from being made while the platform must not be sent
// to (breaker open, sending paused): rows stay PENDING in the database and
// keep their attempts, and new rows are not claimed directly either. When
// the breaker is open and a probe is due, it takes the probe (one per
// interval across every instance) and claims one row for it. wait says the
// caller should look again (it waited for a change, or for the probe time).
func (d *Dispatcher) gated(ctx context.Context, pool *pgxpool.Pool, g *protection.Gate) (probe []outboxdb.Record, wait bool, err error) {
	blocked, until, changed := g.Blocked()
	d.ledger.SetBlocked(blocked)
	if !blocked {
		return nil, false, nil
	}
	if g.State() == protection.BreakerOpen && !time.Now().Before(until) && g.TryProbe(ctx) {
		res, err := d.claim(ctx, pool, outboxdb.ClaimParams{Probe: true})
		if err != nil {
			return nil, false, err
		}
		if len(res.Claimed) > 0 {
			// A message whose attempts are unspent may not be failing on
			// its own: its failure may say the platform is down.
			row := res.Claimed[0]
			g.MarkProbe(row.ID, row.AttemptCount <= 1)
			return res.Claimed, false, nil
		}
		// Nothing due to probe with: the next row that comes will wait for
		// the next probe.
	}
	t := time.NewTimer(max(time.Until(until), minIdleWait))
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	return nil, true, nil
}

// claim runs one claim statement and holds what it took before anything
// else can happen, so that no claimed row is ever forgotten.
//
// The statement runs detached from ctx: cancelling a statement that has
// already committed would lose the claim tokens, leaving the rows
// IN_PROGRESS until their lease runs out. A claim under way when shutdown
// begins gets claimGrace to finish; its rows are then released by handOut.
func (d *Dispatcher) claim(ctx context.Context, pool *pgxpool.Pool, p outboxdb.ClaimParams) (outboxdb.ClaimResult, error) {
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(claimGrace, cancel) })
	defer stop()
	if d.OnClaim != nil {
		d.OnClaim()
	}
	p.Lease, p.Claimer, p.MaxAttempts = d.cfg.Lease, d.cfg.Claimer, d.MaxAttempts()
	until := d.leaseBound()
	res, err := outboxdb.ClaimDue(claimCtx, pool, p)
	if err != nil {
		return res, err
	}
	if len(res.Exhausted) > 0 {
		// Claimed without an attempt: they end FAILED now. Should this
		// write fail, their lease brings them back, exhausted again.
		if _, err := outboxdb.FailExhausted(claimCtx, pool, res.Exhausted, d.RecordOptions()); err != nil {
			d.log.Errorf("Could not mark %d rows out of attempts FAILED (they come back when their lease expires): %v", len(res.Exhausted), err)
		}
	}
	if !d.ledger.Hold(res.Claimed, until) {
		// Closed meanwhile: the rows go back at once.
		d.giveBackUnsent(ctx, pool, res.Claimed)
		return outboxdb.ClaimResult{}, service.ErrEndOfInput
	}
	if d.m.Claimed != nil {
		d.m.Claimed.Incr(int64(len(res.Claimed)))
	}
	if d.m.BatchSize != nil {
		d.m.BatchSize.Set(int64(len(res.Claimed)))
	}
	return res, nil
}

// handOut returns rows to the caller; if shutdown began meanwhile they are
// given back unsent instead, because the engine would drop them unread.
func (d *Dispatcher) handOut(ctx context.Context, pool *pgxpool.Pool, rows []outboxdb.Record) ([]outboxdb.Record, error) {
	if ctx.Err() != nil {
		d.giveBackUnsent(ctx, pool, rows)
		return nil, ctx.Err()
	}
	return rows, nil
}

func (d *Dispatcher) giveBackUnsent(ctx context.Context, pool *pgxpool.Pool, rows []outboxdb.Record) {
	refs := make([]outboxdb.ClaimRef, len(rows))
	for i, r := range rows {
		refs[i] = r.Ref()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if _, err := outboxdb.ReleaseUnsent(rctx, pool, refs); err != nil {
		// Close tries again; failing that, the lease brings them back.
		d.log.Errorf("Could not give back %d claimed rows unsent: %v", len(refs), err)
		return
	}
	d.ledger.Settle(refs)
}

// Done settles the outcome of a batch handed out by Next. On success the
// output has written every row's result already, so the rows are only
// forgotten; a row without a result had its message dropped before the
// output, and fails (failDropped). On a failure the rows still held (no
// result written) go back to PENDING at once: releasing is fenced by claim
// token and status, so rows whose result was written, in a partly failed
// batch, are left alone.
func (d *Dispatcher) Done(ctx context.Context, refs []outboxdb.ClaimRef, ackErr error) error {
	defer signal(d.acked)
	if ackErr == nil {
		dropped := d.ledger.SettleAcked(refs)
		if len(dropped) == 0 || d.hub.attached() == nil {
			// Without the stream's output nothing here writes results
			// (another output took the messages): the rows wait for
			// their lease.
			return nil
		}
		return d.failDropped(ctx, dropped)
	}
	pool := d.Pool()
	if pool == nil {
		d.ledger.Settle(refs)
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	n, err := outboxdb.Release(rctx, pool, refs, d.cfg.NackDelay, "nacked: "+ackErr.Error())
	if d.cfg.NackDelay == 0 {
		d.claimNeeded.Store(true)
	} else {
		d.DueAt(time.Now().Add(d.cfg.NackDelay))
	}
	// Forget the rows even when the release failed (the database is likely
	// down): their lease brings them back and the claim token fences any
	// late write, whereas keeping them held would stop this dispatcher
	// claiming for good once an outage had nacked a ledger's worth of rows.
	d.ledger.Settle(refs)
	if err != nil {
		return fmt.Errorf("releasing %d nacked rows (they come back when their lease expires): %w", len(refs), err)
	}
	d.log.Debugf("Released %d of %d nacked rows: %v", n, len(refs), ackErr)
	return nil
}

// droppedReason is the last_error of a row whose message the pipeline
// dropped.
const droppedReason = "not sent: the pipeline dropped the message before the output (a processor deleted it, e.g. root = deleted() in a mapping)"

// failDropped fails, as invalid, the rows of an acknowledged batch that got
// no result: a processor dropped their messages, so the output never saw
// them. Left alone they would come back at every lease expiry, each time
// dropped again and holding their berth meanwhile, until out of attempts.
// The write is fenced by claim token, like the output's.
func (d *Dispatcher) failDropped(ctx context.Context, refs []outboxdb.ClaimRef) error {
	pool := d.Pool()
	if pool == nil {
		return nil
	}
	results := make([]outboxdb.Result, len(refs))
	ids := make([]int64, len(refs))
	for i, r := range refs {
		results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusFailed, Class: outboxdb.ClassInvalid, Error: droppedReason}
		ids[i] = r.ID
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if _, err := RecordResults(rctx, pool, d, results); err != nil {
		return fmt.Errorf("failing %d rows whose messages the pipeline dropped (they come back when their lease expires): %w", len(refs), err)
	}
	d.dropped.Warn("dropped", fmt.Sprintf("Outbox rows %v FAILED: the pipeline dropped their messages before the output (a processor deleted them); they are never sent", ids))
	return nil
}

// waitForWork sleeps until rows may be due in the database (a notification,
// the next due time, the poll interval) or rows are handed over, and says
// which by setting claimNeeded. The next due time is read once per idle
// period, not per wake-up.
func (d *Dispatcher) waitForWork(ctx context.Context, pool *pgxpool.Pool, listener *outboxdb.Listener) error {
	now := time.Now()
	if !d.dueKnown {
		d.dueKnown = true
		d.dueAt = now.Add(d.cfg.PollInterval)
		due, ok, err := outboxdb.NextDue(ctx, pool)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			d.log.Debugf("Could not read the next due time, polling: %v", err)
		case ok && due <= 0:
			// Due but locked by another claimer or a result being written.
			d.idleWait = min(max(d.idleWait*2, minIdleWait), d.cfg.PollInterval)
			d.dueAt = now.Add(d.idleWait)
		case ok:
			d.idleWait = 0
			d.dueAt = now.Add(min(due, d.cfg.PollInterval))
		}
	}
	if hint := d.takeHint(); !hint.IsZero() && hint.Before(d.dueAt) {
		d.dueAt = hint
	}
	t := time.NewTimer(max(d.dueAt.Sub(now), 0))
	defer t.Stop()
	if d.OnIdle != nil {
		d.OnIdle()
	}
	select {
	case <-listener.Wake():
		d.claimNeeded.Store(true)
	case <-t.C:
		d.claimNeeded.Store(true)
	case <-d.nudge:
		// Rows handed over, or an earlier due time: look again.
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (d *Dispatcher) takeHint() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.hintAt
	d.hintAt = time.Time{}
	return t
}

// DueAt says a row will be due at t (a retry the output just scheduled), so
// that it is claimed on time without polling.
func (d *Dispatcher) DueAt(t time.Time) {
	d.mu.Lock()
	if d.hintAt.IsZero() || t.Before(d.hintAt) {
		d.hintAt = t
	}
	d.mu.Unlock()
	signal(d.nudge)
}

// DirectClaim says how rows are claimed for this dispatcher when inserted.
func (d *Dispatcher) DirectClaim() outboxdb.DirectClaim {
	return outboxdb.DirectClaim{Lease: d.cfg.Lease, Claimer: d.cfg.Claimer}
}

// ReserveWithin grants room to rows about to be inserted claimed, waiting up
// to bound for room for every row while delivery is moving (see
// Ledger.ReserveWithin; bound 0: no wait), and none before the process has
// started, before the dispatcher has connected, or while its renewals are
// late: those rows are inserted PENDING, for Next to claim. Rows claimed for
// a dispatcher still waiting for its database (its wait backs off further
// than ingest's) were held with no renewal running: their leases ran out,
// Next claimed them again, and both claims were sent. A dispatcher whose
// renewals fail (its database lost after start, its pool exhausted) would
// hold new claims the same way. The grant's lease bound is taken after the
// wait.
func (d *Dispatcher) ReserveWithin(ctx context.Context, sizes []int, bound time.Duration) Grant {
	if !d.started.Ready() || !d.renewing() {
		return Grant{}
	}
	g := d.ledger.ReserveWithin(ctx, sizes, bound)
	g.until = d.leaseBound()
	return g
}

// leaseBound is when a lease taken or renewed by a statement sent from now
// on ends at the latest, on this instance's clock (see Ledger.Hold).
func (d *Dispatcher) leaseBound() time.Time { return time.Now().Add(d.cfg.Lease) }

// Deliver hands over rows inserted claimed under g (see Ledger.Deliver).
func (d *Dispatcher) Deliver(g Grant, rows []outboxdb.Record) bool {
	if !d.ledger.Deliver(g, rows) {
		return false
	}
	if len(rows) > 0 && d.m.Direct != nil {
		d.m.Direct.Incr(int64(len(rows)))
	}
	signal(d.nudge)
	return true
}

// Close gives back every claim still held, stops the loops and releases the
// pool. The engine calls it once pending acks have resolved, so what is
// still held was either dropped by the engine at shutdown or is still in
// flight after a forced stop: rows handed over but never sent go back as if
// never claimed; the others may have reached the platform, so their attempt
// stands (a late result is fenced out).
func (d *Dispatcher) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	pool, stop, loops := d.pool, d.stop, d.loops
	d.mu.Unlock()
	d.hub.dropDispatcher(d)
	d.dropped.Flush()
	unsent, others := d.ledger.Close()
	if stop != nil {
		stop()
		for _, l := range loops {
			l.Stop()
		}
		d.done.Wait()
	}
	if pool == nil {
		return nil
	}
	defer d.hub.Release()
	if len(unsent)+len(others) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	var errs []error
	if len(unsent) > 0 {
		if _, err := outboxdb.ReleaseUnsent(rctx, pool, unsent); err != nil {
			errs = append(errs, fmt.Errorf("giving back %d rows handed over but never sent: %w", len(unsent), err))
		}
	}
	if len(others) > 0 {
		if n, err := outboxdb.Release(rctx, pool, others, 0, "released at shutdown without a result"); err != nil {
			errs = append(errs, fmt.Errorf("releasing %d claimed rows: %w", len(others), err))
		} else {
			d.log.Infof("Released %d claimed rows at shutdown", n)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("at shutdown (the rows come back when their lease expires): %w", err)
	}
	return nil
}

func (d *Dispatcher) logExhausted(rows []outboxdb.Record) {
	const show = 10
	ids := make([]int64, 0, min(len(rows), show))
	for _, r := range rows[:min(len(rows), show)] {
		ids = append(ids, r.ID)
	}
	d.log.Warnf("Marked %d due rows FAILED: out of attempts (max_attempts %d); ids %v; first: %s",
		len(rows), d.MaxAttempts(), ids, rows[0].LastErrorText())
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}
