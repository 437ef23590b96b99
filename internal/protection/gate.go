// Package protection protects the platform the outbox forwards to, for
// every instance sharing the database at once: a circuit breaker whose
// state is shared through PostgreSQL, probes, pauses asked for by
// Retry-After, an adaptive concurrency limit and a rate limit
// (docs/architecture.md, "Protecting the platform"). The output admits each
// request through a Gate and tells it how the request went; the claim
// engine (internal/dispatch) asks it whether to claim at all.
package protection

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

// Config configures a Gate. Zero values take the defaults given.
type Config struct {
	// ProbeInterval: while the breaker is open, at most one probe per
	// interval across every instance. Default 5s.
	ProbeInterval time.Duration
	// RateLimit caps the requests per second across every instance; 0: none.
	RateLimit float64
	// MaxInFlight is the largest concurrency limit. Required.
	MaxInFlight int
	// Breaker says when the platform is judged down.
	Breaker BreakerConfig
	// SyncInterval is how often the shared state is read. Default 1s.
	SyncInterval time.Duration
	// Instance names this instance in the shared state.
	Instance string
}

// Metrics are the gate's gauges and counters; nil fields are skipped.
type Metrics struct {
	State  *service.MetricGauge   // forwarder_platform_breaker_state
	Limit  *service.MetricGauge   // forwarder_platform_concurrency_limit
	Free   *service.MetricGauge   // forwarder_semaphore_available_permits
	Probes *service.MetricCounter // forwarder_platform_probes_total{result}
	// An operator's pause of delivery: held 0/1, and its start and end
	// (0: until resumed) as Unix times.
	Paused       *service.MetricGauge // forwarder_delivery_paused
	PauseStarted *service.MetricGauge // forwarder_delivery_pause_started_timestamp_seconds
	PauseEnd     *service.MetricGauge // forwarder_delivery_pause_end_timestamp_seconds
}

// Permit is what the gate allows one request.
type Permit int

const (
	// Send: an ordinary request.
	Send Permit = iota
	// Probe: the one request that tests an open breaker.
	Probe
	// Deny: not now (breaker open, sending paused, or delivery paused by
	// an operator); give the claim back without spending an attempt.
	Deny
)

// Gate protects the platform, for every instance sharing the database at
// once: a circuit breaker (each instance judges from the replies it sees and
// the healthy ones the others announce; the state is shared through
// PostgreSQL so that all stop within a second),
// probes (one per interval across the cluster, taken in PostgreSQL), a pause
// asked for by Retry-After, an operator's pause of delivery (see hold), an
// adaptive concurrency limit per instance and an optional rate limit across
// the cluster.
//
// The output admits each request (Admit) and finishes it with the reply
// (Ticket.Finish), one call each; the dispatcher asks it whether to claim at
// all (Blocked), takes the probes (TryProbe, MarkProbe) and hands it what
// its listener hears of the others (FollowPause, FollowPeerHealthy).
type Gate struct {
	cfg     Config
	log     *service.Logger
	m       Metrics
	limiter *Limiter
	rate    *RateLimit

	mu sync.Mutex
	b  *breaker
	// pausedUntil and nextProbeAt are on the local clock (the shared state
	// says how much time is left of each; see follow).
	pausedUntil time.Time
	nextProbeAt time.Time
	// hold is the operator's pause as last read; held says whether this
	// instance holds delivery for it (see checkHoldLocked).
	hold hold
	held bool
	// probes holds the rows marked to carry a probe, and whether each
	// one's attempts are unspent (see MarkProbe).
	probes  map[int64]bool
	changed chan struct{}
	// decisions counts this instance's own changes of the breaker and
	// pauses, and sharing counts its writes of the breaker under way: a
	// shared state read before one of them is older than it and must not
	// undo it (see follow).
	decisions uint64
	sharing   int
	// pauseWanted is the end of the longest Retry-After pause this
	// instance has been asked for, and pauseSharing says whether a write
	// of it is under way (see pause).
	pauseWanted  time.Time
	pauseSharing bool
	// answered is when this instance last had a healthy reply, and
	// announced the one it last told the others of (see announceHealthy).
	answered, announced time.Time
	// db runs the gate's statements; nil while stopped.
	db *session
	// syncs reads the shared state every SyncInterval while started.
	syncs *periodic.Loop
	users int
}

// NewGate returns a gate; Start connects it to the database.
func NewGate(cfg Config, log *service.Logger, m Metrics) *Gate {
	cfg.ProbeInterval = cmp.Or(cfg.ProbeInterval, 5*time.Second)
	cfg.SyncInterval = cmp.Or(cfg.SyncInterval, time.Second)
	cfg.MaxInFlight = max(cfg.MaxInFlight, 1)
	g := &Gate{
		cfg:     cfg,
		log:     log,
		m:       m,
		limiter: NewLimiter(cfg.MaxInFlight),
		b:       newBreaker(cfg.Breaker),
		probes:  map[int64]bool{},
		changed: make(chan struct{}),
	}
	// A gauge is set only when its value changes: the limiter reports on
	// every request, and a set looks its series up by label each time.
	// The last values are guarded by the limiter's lock, held when it
	// calls OnChange.
	lastLimit, lastFree := -1, -1
	g.limiter.OnChange = func(limit, free int) {
		if m.Limit != nil && limit != lastLimit {
			m.Limit.Set(int64(limit))
		}
		if m.Free != nil && free != lastFree {
			m.Free.Set(int64(free))
		}
		lastLimit, lastFree = limit, free
	}
	g.limiter.Reset(cfg.MaxInFlight)
	if m.State != nil {
		m.State.Set(int64(BreakerClosed))
	}
	for _, gauge := range []*service.MetricGauge{m.Paused, m.PauseStarted, m.PauseEnd} {
		if gauge != nil {
			gauge.Set(0)
		}
	}
	return g
}

// Start reads the shared state now and then every SyncInterval until Stop;
// calls are counted, the last Stop stops it.
func (g *Gate) Start(ctx context.Context, pool *pgxpool.Pool) error {
	g.mu.Lock()
	g.users++
	if g.db != nil {
		g.mu.Unlock()
		return nil
	}
	db := newSession(pool)
	g.db = db
	g.rate = NewRateLimit(g.cfg.RateLimit, func(ctx context.Context, n int, rate, burst float64) (bool, time.Duration, error) {
		return outboxdb.TakeRateTokens(ctx, pool, n, rate, burst)
	})
	g.mu.Unlock()
	g.sync(ctx)
	// The loop starts after the first read, so that two reads never
	// overlap, unless the gate was stopped (or stopped and started again)
	// meanwhile.
	g.mu.Lock()
	if g.db == db && g.syncs == nil {
		g.syncs = periodic.Start(context.Background(), periodic.Config{Interval: g.cfg.SyncInterval}, g.sync)
	}
	g.mu.Unlock()
	return nil
}

// Stop ends the sync loop when the last user stops.
func (g *Gate) Stop() {
	g.mu.Lock()
	g.users--
	var (
		syncs *periodic.Loop
		db    *session
	)
	if g.users == 0 {
		syncs, db = g.syncs, g.db
		g.db, g.syncs = nil, nil
	}
	g.mu.Unlock()
	syncs.Stop()
	if db != nil {
		db.close()
	}
}

// syncReadTimeout bounds one read of the shared state: longer than the
// interval, so that a loaded database still answers (a late state beats
// none), short enough that a stuck read does not stop the loop for long.
const syncReadTimeout = 5 * time.Second

// sync reads the shared state and follows it.
func (g *Gate) sync(ctx context.Context) {
	g.mu.Lock()
	db := g.db
	seen := g.decisions
	g.mu.Unlock()
	if db == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, max(g.cfg.SyncInterval, syncReadTimeout))
	defer cancel()
	var s outboxdb.PlatformState
	err := db.do(rctx, func(q outboxdb.Querier) (err error) {
		s, err = outboxdb.ReadPlatformState(rctx, q)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			g.log.Debugf("Reading the shared platform state: %v", err)
		}
		return
	}
	g.follow(s, time.Now(), seen)
	g.announceHealthy(ctx, db)
}

// announceHealthy tells the other instances sharing the database, on the
// outbox's notification channel, when this one last had a healthy reply, if
// it had one since it last said so: at most once per SyncInterval. Their
// breakers take it as their own (FollowPeerHealthy), so that the cluster
// judges the platform from every reply, as one instance would. It is a
// hint: a failure is only logged.
func (g *Gate) announceHealthy(ctx context.Context, db *session) {
	g.mu.Lock()
	answered := g.answered
	if !answered.After(g.announced) {
		g.mu.Unlock()
		return
	}
	g.announced = answered
	g.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, syncReadTimeout)
	defer cancel()
	err := db.do(actx, func(q outboxdb.Querier) error {
		return outboxdb.AnnounceHealthy(actx, q, g.cfg.Instance, time.Since(answered))
	})
	if err != nil && ctx.Err() == nil {
		g.log.Debugf("Could not tell the other instances the platform answered: %v", err)
	}
}

// FollowPeerHealthy takes the announcement of instance (AnnounceHealthy):
// it had a healthy reply ago before the announcement arrived. This
// instance's own announcements are ignored.
func (g *Gate) FollowPeerHealthy(instance string, ago time.Duration) {
	if instance == g.cfg.Instance {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.b.observePeerHealthy(now, now.Add(-ago))
}

// follow takes the shared state s, whose reply arrived at the local time
// arrived, unless this instance decided something since the read began
// (seen is decisions then) or is writing a decision now: the state may
// predate that decision, and
// following it would, for instance, close a breaker this instance has just
// opened, so that a row on its last attempt fails during an outage. The
// next read shows the decision. The times left in s count from arrived: a
// reply slowed by a loaded machine makes a pause last longer here, never
// shorter. A pause only ever lengthens.
func (g *Gate) follow(s outboxdb.PlatformState, arrived time.Time, seen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.PausedFor > 0 {
		g.lengthenPauseLocked(arrived.Add(s.PausedFor))
	}
	// The operator's pause is never this instance's decision: it is
	// followed whatever this instance decided meanwhile.
	g.hold = holdFrom(s.Pause, arrived)
	g.checkHoldLocked(time.Now())
	// A pause taken again holds on with a new end: the gauges follow
	// each read (and each change of holding), never each request.
	g.pauseTimesLocked()
	if g.decisions != seen || g.sharing > 0 {
		return
	}
	g.nextProbeAt = arrived.Add(s.ProbeIn)
	g.followLocked(parseBreakerState(s.Breaker), s.Reason)
}

// followLocked takes state as the breaker's, whoever changed it.
func (g *Gate) followLocked(state BreakerState, reason string) {
	if from := g.b.state; from != state {
		g.b.set(state, time.Now())
		g.changedLocked(from, state, reason)
	}
}

// changedLocked does what a change of the breaker's state entails.
func (g *Gate) changedLocked(from, state BreakerState, reason string) {
	if state == BreakerOpen {
		g.nextProbeAt = time.Now().Add(g.cfg.ProbeInterval)
	}
	switch state {
	case BreakerOpen, BreakerHalfOpen:
		// Start from one request at a time when the platform comes back.
		g.limiter.Reset(1)
	}
	if g.m.State != nil {
		g.m.State.Set(int64(state))
	}
	if state == BreakerOpen {
		g.log.Warnf("Platform circuit breaker %s -> OPEN: only probes are sent (one per %v across all instances) until the platform answers: %s", from, g.cfg.ProbeInterval, reason)
	} else {
		g.log.Infof("Platform circuit breaker %s -> %s", from, state)
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// checkHoldLocked holds delivery or lets it go on as the operator's pause
// says at now, and does what a change entails: the log, the metrics, and
// on resuming the same ramp as after an outage, from one request at a time.
func (g *Gate) checkHoldLocked(now time.Time) bool {
	h := g.hold
	on := h.holds(now)
	if on == g.held {
		return on
	}
	g.held = on
	if !on {
		// Before the paused gauge says resumed: a scrape between the two
		// saw delivery resumed with the limit it had before the pause.
		g.limiter.Reset(1)
	}
	g.pauseTimesLocked()
	if g.m.Paused != nil {
		var v int64
		if on {
			v = 1
		}
		g.m.Paused.Set(v)
	}
	if on {
		end := "until resumed"
		if !h.until.IsZero() {
			end = "until " + h.until.UTC().Format(time.RFC3339)
		}
		g.log.Warnf("Delivery paused by %s %s (%s): no request is sent, not even a probe; messages wait PENDING", h.by, end, h.reason)
	} else {
		g.log.Infof("Delivery resumed after the operator's pause: sending again, from one request at a time")
	}
	close(g.changed)
	g.changed = make(chan struct{})
	return on
}

// pauseTimesLocked sets the pause's start and end gauges as this instance
// holds delivery (0 while it does not). Called on a read of the shared
// state or a change of holding, never per request.
func (g *Gate) pauseTimesLocked() {
	if g.m.PauseStarted != nil {
		g.m.PauseStarted.Set(unixOrZero(g.hold.since, g.held))
	}
	if g.m.PauseEnd != nil {
		g.m.PauseEnd.Set(unixOrZero(g.hold.until, g.held))
	}
}

// unixOrZero is t as Unix seconds when set and use holds, else 0.
func unixOrZero(t time.Time, use bool) int64 {
	if !use || t.IsZero() {
		return 0
	}
	return t.Unix()
}

// State is the breaker's state as this instance knows it.
func (g *Gate) State() BreakerState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.b.state
}

// ErrDenied is Admit's answer when a request must not go now: the breaker
// is open (and the row does not carry the probe) or sending is paused. The
// claim goes back without spending an attempt.
var ErrDenied = errors.New("the platform must not be sent to now: circuit breaker open or sending paused")

// Admit lets the request of row id go: it waits for a request slot and a
// rate token, then asks the breaker (after the wait: it may have opened
// meanwhile). It returns the ticket of the request, to be finished (Finish)
// once the platform answered, or dropped (Drop) when the request is not
// made or is interrupted; ErrDenied when the request must not go now; or
// ctx's error when ctx ends first (the output is stopping: the row's probe
// mark, if any, is dropped).
func (g *Gate) Admit(ctx context.Context, id int64) (*Ticket, error) {
	if err := g.acquire(ctx); err != nil {
		g.forgetProbe(id)
		return nil, err
	}
	p := g.allow(id)
	if p == Deny {
		g.limiter.Release()
		return nil, ErrDenied
	}
	return &Ticket{g: g, id: id, permit: p, sent: time.Now()}, nil
}

// Ticket is one admitted request; it holds a request slot until Finish or
// Drop, whichever comes first.
type Ticket struct {
	g      *Gate
	id     int64
	permit Permit
	// sent is when the request was let go.
	sent time.Time
	done bool
}

// Probe says whether the request carries the probe of an open breaker.
func (t *Ticket) Probe() bool { return t.permit == Probe }

// Finish tells the gate how the platform answered and gives the slot back.
// counted says whether the row's attempt may count (see report).
func (t *Ticket) Finish(ctx context.Context, r Reply) (counted bool) {
	if t.done {
		return false
	}
	t.done = true
	defer t.g.limiter.Release()
	if r.Sent.IsZero() {
		r.Sent = t.sent
	}
	return t.g.report(ctx, t.id, t.permit, r)
}

// Drop gives the slot back for a request that was not made or got no
// answer because the output is stopping: nothing is learnt about the
// platform, and a probe mark it carried is dropped, so that the row is not
// taken for a probe when it is claimed again.
func (t *Ticket) Drop() {
	if t.done {
		return
	}
	t.done = true
	t.g.forgetProbe(t.id)
	t.g.limiter.Release()
}

// allow says whether the request of row id may go now.
func (g *Gate) allow(id int64) Permit {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if now.Before(g.pausedUntil) || g.checkHoldLocked(now) {
		return Deny
	}
	if _, ok := g.probes[id]; ok {
		return Probe
	}
	if g.b.state == BreakerOpen {
		return Deny
	}
	return Send
}

// acquire waits for a request slot and a rate token.
func (g *Gate) acquire(ctx context.Context) error {
	if err := g.limiter.Acquire(ctx); err != nil {
		return err
	}
	g.mu.Lock()
	rate := g.rate
	g.mu.Unlock()
	if err := rate.Wait(ctx); err != nil {
		g.limiter.Release()
		return err
	}
	return nil
}

// Limiter is the adaptive concurrency limit.
func (g *Gate) Limiter() *Limiter { return g.limiter }

// Reply is what the platform's answer to one request says about the
// platform itself, whatever it says about the message.
type Reply struct {
	// Unavailable: no reply, a timeout, a 5xx, a 429 or a 2xx that is not
	// JSON (unless a rule says the reply concerns its message alone).
	Unavailable bool
	// Fresh: the message's attempts were unspent before this one (its
	// first attempt, or its earlier failures did not count). Only fresh
	// messages' failures are evidence of an outage; a message that has
	// failed on its own fails again for its own reasons.
	Fresh bool
	// Last: the row has no attempt left after this one, so that an
	// unavailable reply that counts ends it FAILED. Such a reply counts
	// only when the message has been seen failing on its own.
	Last bool
	// Overloaded: the platform asked for less (429, 502, 503, 504) or did
	// not answer (a timeout, a refused connection). Only these halve the
	// concurrency limit: a 500 says the platform failed that request, and a
	// few messages it cannot handle must not slow the others.
	Overloaded bool
	// PauseFor is a Retry-After to honour on every instance (0: none).
	PauseFor time.Duration
	// Why describes the reply, for the log.
	Why string
	// Sent is when the request was sent (zero: when the reply is
	// reported); Ticket.Finish sets it.
	Sent time.Time
	// PreviousFailure is when the message last failed, on whichever
	// instance, as its claimed row says (zero: it has not failed). Its
	// failure counts only if a request sent after that one was answered
	// healthy: its retries may go to other instances, whose replies this
	// instance does not see (docs/architecture.md, "Protecting the
	// platform").
	PreviousFailure time.Time
	// Attempt is the row's attempt this request made, as its claim numbers
	// it (0: unknown). A requeue numbers a message's attempts from 1 again:
	// the breaker then forgets the failures it saw of the message before.
	Attempt int
}

// report tells the gate how the platform answered the request of row id,
// sent with permit p. For an unavailable reply, counted says whether the
// row's attempt may count: a failed probe never counts, nor a reply while
// the breaker is not closed, sending is paused, or nothing shows the
// platform up (docs/guarantees.md #13, #16).
func (g *Gate) report(ctx context.Context, id int64, p Permit, r Reply) (counted bool) {
	if r.PauseFor > 0 {
		g.pause(ctx, r.PauseFor)
	}
	if p == Probe {
		g.mu.Lock()
		if !r.Unavailable {
			g.answered = time.Now()
		}
		unspent := g.probes[id]
		delete(g.probes, id)
		g.mu.Unlock()
		g.probed(ctx, id, r, unspent)
		return false
	}
	switch {
	case !r.Unavailable:
		g.limiter.Healthy()
	case r.Overloaded:
		g.limiter.Unavailable()
	}
	g.mu.Lock()
	from := g.b.state
	now := time.Now()
	if !r.Unavailable {
		g.answered = now
	}
	t, counts := g.b.observeReply(now, id, r)
	if now.Before(g.pausedUntil) || g.checkHoldLocked(now) {
		if counts {
			g.b.heldBack(id)
		}
		counts = false
	}
	if t != stay {
		g.decisions++
		g.changedLocked(from, g.b.state, r.Why)
	}
	g.mu.Unlock()
	switch t {
	case trip:
		g.setShared(ctx, []BreakerState{BreakerClosed, BreakerHalfOpen}, BreakerOpen, "failures of distinct messages and no healthy reply for "+g.b.cfg.Silence.String()+", e.g. "+r.Why)
	case recover:
		g.setShared(ctx, []BreakerState{BreakerHalfOpen}, BreakerClosed, "the platform answered again")
	}
	return counts
}

// probed follows the reply to the probe carried by row id, whose attempts
// were unspent or not (MarkProbe), and says what it proved: healthy,
// unavailable, or inconclusive. A failure proves the platform down only
// with a message not failing on its own: attempts unspent, and no healthy
// answer to a request sent after its previous failure.
func (g *Gate) probed(ctx context.Context, id int64, r Reply, unspent bool) (result string) {
	g.mu.Lock()
	fresh := unspent && !g.b.failsOnItsOwn(r.PreviousFailure)
	g.mu.Unlock()
	result = "healthy"
	switch {
	case r.Unavailable && !fresh:
		result = "inconclusive"
	case r.Unavailable:
		result = "unavailable"
	}
	if g.m.Probes != nil {
		g.m.Probes.Incr(1, result)
	}
	switch result {
	case "inconclusive":
		g.log.Infof("Platform probe with row %d failed, but that message has failed on its own before (no other message was due to probe with): it proves nothing, the breaker stays open until a probe with another message: %s", id, r.Why)
		return result
	case "unavailable":
		g.log.Infof("Platform probe failed, the breaker stays open: %s", r.Why)
		return result
	}
	g.setShared(ctx, []BreakerState{BreakerOpen}, BreakerHalfOpen, "a probe succeeded")
	return result
}

// setShared changes the shared state and follows it at once; another
// instance may have changed it first, which the next sync shows.
func (g *Gate) setShared(ctx context.Context, from []BreakerState, to BreakerState, reason string) {
	g.mu.Lock()
	db := g.db
	g.sharing++
	g.decisions++
	g.mu.Unlock()
	if db != nil {
		names := make([]string, len(from))
		for i, s := range from {
			names[i] = s.String()
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := db.do(wctx, func(q outboxdb.Querier) error {
			_, err := outboxdb.SetBreaker(wctx, q, names, to.String(), g.cfg.Instance, reason, g.cfg.ProbeInterval)
			return err
		})
		cancel()
		if err != nil {
			g.log.Warnf("Could not share the breaker state %s (this instance follows it alone until it can): %v", to, err)
		}
	}
	g.mu.Lock()
	g.sharing--
	g.decisions++
	g.followLocked(to, reason)
	g.mu.Unlock()
}

// pause holds this instance's requests for d at once and shares the pause
// with the others. A platform that answers every request in flight with
// 429 at once asks for the same pause many times: one write shares it, and
// the replies that come during that write are shared by one more write if
// they ask for longer, instead of a write each, every one waiting for the
// shared row that the one before it locks.
func (g *Gate) pause(ctx context.Context, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.decisions++
	until := time.Now().Add(d)
	g.lengthenPauseLocked(until)
	if until.After(g.pauseWanted) {
		g.pauseWanted = until
	}
	if g.pauseSharing || g.db == nil {
		return
	}
	g.pauseSharing = true
	defer func() { g.pauseSharing = false }()
	for shared := (time.Time{}); g.pauseWanted.After(shared) && g.db != nil; {
		db, want := g.db, g.pauseWanted
		g.mu.Unlock()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := db.do(wctx, func(q outboxdb.Querier) error {
			_, err := outboxdb.PausePlatform(wctx, q, time.Until(want))
			return err
		})
		cancel()
		if err != nil {
			g.log.Warnf("Could not share a pause of %v asked for by the platform: %v", d, err)
		}
		g.mu.Lock()
		shared = want
		if err != nil {
			return
		}
	}
}

// FollowPause holds this instance's requests for left, what was left of a
// pause another instance shared when the database announced it (its
// listener hears it at once; the read of the shared state every
// SyncInterval is the backstop for an announcement lost while the listener
// reconnects). Counted from now, after the announcement, the pause lasts
// as long here or a little longer, never shorter. A pause only lengthens.
func (g *Gate) FollowPause(left time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if left > 0 {
		g.lengthenPauseLocked(time.Now().Add(left))
	}
}

// lengthenPauseLocked holds requests until until, unless a longer pause
// holds them already (whoever asked for it: this instance's reply, another
// instance's announcement or the shared state's read), and wakes whoever
// waits on a change of state.
func (g *Gate) lengthenPauseLocked(until time.Time) {
	if until.After(g.pausedUntil) {
		g.pausedUntil = until
		close(g.changed)
		g.changed = make(chan struct{})
	}
}

// Blocked says whether claims must wait: the breaker is open, sending is
// paused, or an operator paused delivery. until is when it is worth looking
// again (the pause's end, or the next probe); changed is closed at the next
// change of state.
func (g *Gate) Blocked() (blocked bool, until time.Time, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	switch {
	case g.checkHoldLocked(now):
		if g.hold.end.IsZero() {
			// Until resumed: the next read of the shared state closes
			// changed.
			return true, now.Add(g.cfg.SyncInterval), g.changed
		}
		return true, g.hold.end, g.changed
	case now.Before(g.pausedUntil):
		return true, g.pausedUntil, g.changed
	case g.b.state == BreakerOpen:
		return true, g.nextProbeAt, g.changed
	}
	return false, time.Time{}, g.changed
}

// TryProbe asks for the next probe: true when this instance may send it
// now.
func (g *Gate) TryProbe(ctx context.Context) bool {
	g.mu.Lock()
	db := g.db
	held := g.checkHoldLocked(time.Now())
	g.mu.Unlock()
	if db == nil || held {
		return false
	}
	var won bool
	err := db.do(ctx, func(q outboxdb.Querier) (err error) {
		won, err = outboxdb.TryProbe(ctx, q, g.cfg.ProbeInterval)
		return err
	})
	g.mu.Lock()
	g.nextProbeAt = time.Now().Add(g.cfg.ProbeInterval)
	g.mu.Unlock()
	if err != nil {
		g.log.Debugf("Taking a probe: %v", err)
		return false
	}
	return won
}

// MarkProbe marks the row that will carry the probe; unspent says its
// attempts have not been spent (false: it was chosen because no such
// message was due), so that, unless it failed while others were answered,
// its failure says the platform is down.
func (g *Gate) MarkProbe(id int64, unspent bool) {
	g.mu.Lock()
	g.probes[id] = unspent
	g.mu.Unlock()
}

// forgetProbe drops a probe mark that was never used (the row went back).
func (g *Gate) forgetProbe(id int64) {
	g.mu.Lock()
	delete(g.probes, id)
	g.mu.Unlock()
}
