package protection

import (
	"cmp"
	"slices"
	"time"
)

// BreakerState is the circuit breaker's state; the numbers are those of the
// gauge forwarder_platform_breaker_state.
type BreakerState int

const (
	// BreakerClosed: requests flow.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: a probe succeeded; requests flow again with
	// concurrency ramping up from one, until enough distinct messages have
	// been answered.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen: the platform is down; only probes are sent, at most one
	// per probe interval across every instance.
	BreakerOpen BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "HALF_OPEN"
	case BreakerOpen:
		return "OPEN"
	default:
		return "CLOSED"
	}
}

func parseBreakerState(s string) BreakerState {
	switch s {
	case "HALF_OPEN":
		return BreakerHalfOpen
	case "OPEN":
		return BreakerOpen
	default:
		return BreakerClosed
	}
}

// BreakerConfig says when the platform is judged down. Zero values take the
// defaults given.
type BreakerConfig struct {
	// Window is how long a reply counts as evidence. Default 10s.
	Window time.Duration
	// Messages is how many distinct messages must have found the platform
	// unavailable since its last healthy reply before it may be judged
	// down. Replies about one message count once, however often it is
	// retried, so a few messages the platform cannot handle never make an
	// outage. Default 5.
	Messages int
	// Silence is how long the platform must have given no healthy reply, to
	// any message, before the breaker opens. Under load a platform that
	// fails some messages (or a share of requests at random) gives runs of
	// failures of distinct messages, but healthy replies keep coming between
	// them. Default 3s.
	Silence time.Duration
	// HalfOpenMessages is how many distinct messages answered healthy close
	// a half-open breaker. Default 10.
	HalfOpenMessages int
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	c.Window = cmp.Or(c.Window, 10*time.Second)
	c.Messages = cmp.Or(c.Messages, 5)
	c.Silence = cmp.Or(c.Silence, 3*time.Second)
	c.HalfOpenMessages = cmp.Or(c.HalfOpenMessages, 10)
	return c
}

// breaker is one instance's judgement of the platform from the replies it
// sees. It judges the platform, not a message (docs/architecture.md,
// "Protecting the platform"): the platform is down when failures span
// distinct fresh messages (not failing on their own) and healthy replies
// have stopped; a message that fails while others are answered is failing
// on its own, its attempts count, and its retries are no evidence of an
// outage. It does no I/O and keeps no clock (the caller passes now), so it
// is tested as a plain value. The Gate shares its decisions with the other
// instances through PostgreSQL.
type breaker struct {
	cfg   BreakerConfig
	state BreakerState
	// lastHealthy is when the platform last answered a message on purpose
	// (zero: not yet), and healthySeq that reply's number: replies are
	// numbered in the order observed, so that replies at the same instant
	// still come one after the other.
	lastHealthy time.Time
	healthySeq  uint64
	// peerHealthy is the latest healthy reply another instance announced
	// (see observePeerHealthy), and peerSeq the number of the last reply
	// this breaker saw before it.
	peerHealthy time.Time
	peerSeq     uint64
	seq         uint64
	// healthySent is when the latest-sent request answered healthy was
	// sent: a reply to a request sent before a message's failure says
	// nothing of the platform after it (see observeReply).
	healthySent time.Time
	// first is when the first reply came: silence counts from it until the
	// platform has answered once.
	first time.Time
	// failures lists the unavailable replies of the window, oldest first;
	// latest holds each failing message's latest one.
	failures []failure
	latest   map[int64]failure
	// healed holds the distinct messages answered healthy since the breaker
	// half-opened.
	healed map[int64]struct{}
}

// failure is one unavailable reply.
type failure struct {
	id  int64
	at  time.Time
	seq uint64
	// fresh: evidence of an outage. The message's attempts were unspent
	// (its first attempt, or its earlier failures did not count) and
	// nothing sent after its previous failure was answered.
	fresh bool
	// attempt is the row's attempt that failed (0: unknown), and counted
	// whether it spent it.
	attempt int
	counted bool
}

// requeuedBy says whether the row of failure f was requeued since, as its
// claim for attempt (0: unknown) shows: only a requeue numbers a row's
// attempts lower than before, or the same after one that counted (an
// attempt that does not count is given back, and the next one takes its
// number). What the breaker saw of the message before the requeue is not
// the new message's: an operator's requeue a moment after a row ended
// FAILED would otherwise have its first failure count as the message
// failing on its own, and a row allowed one attempt end FAILED again at
// the start of an outage.
func (f failure) requeuedBy(attempt int) bool {
	return attempt > 0 && f.attempt > 0 && (attempt < f.attempt || attempt == f.attempt && f.counted)
}

func newBreaker(cfg BreakerConfig) *breaker {
	return &breaker{cfg: cfg.withDefaults(), latest: map[int64]failure{}, healed: map[int64]struct{}{}}
}

// transition is what a reply made the breaker do.
type transition int

const (
	stay    transition = iota
	trip               // open it
	recover            // close it (from half-open)
)

// observeReply records r, the reply at now to an ordinary request (not a
// probe) for the message of row id. For an unavailable reply, counts says
// whether it may spend the row's attempt: only while the platform is
// evidently up, that is the breaker is closed, another message was
// answered within the window, fewer than Messages distinct messages not
// failing on their own failed since, and a request sent after this
// message's own previous failure was answered healthy (a message failing
// again before anything else got through says nothing about itself; and
// at the start of an outage the requests sent before it are still
// answered for a moment, so that a message retried quickly would otherwise
// find one of those replies between each of its failures and spend every
// attempt on the outage). The reply that would end the row FAILED (r.Last)
// asks more: the message failed before and a request sent after that
// failure was answered healthy. Its first failure, however evidently up
// the platform, may be the outage beginning (the requests in flight when it
// goes down fail as new messages while the replies before it still make it
// look up): counted, a row allowed a single attempt ended FAILED by an
// outage.
// The previous failure is the later of the one this breaker saw (unless
// the row was requeued since: failure.requeuedBy) and the one the row
// carries (r.PreviousFailure), since a row's retries may go to any
// instance.
func (b *breaker) observeReply(now time.Time, id int64, r Reply) (t transition, counts bool) {
	sent := cmp.Or(r.Sent, now)
	b.expire(now)
	b.seq++
	if b.first.IsZero() {
		b.first = now
	}
	if !r.Unavailable {
		b.lastHealthy, b.healthySeq = now, b.seq
		if sent.After(b.healthySent) {
			b.healthySent = sent
		}
		delete(b.latest, id)
		if b.state == BreakerHalfOpen {
			b.healed[id] = struct{}{}
			if len(b.healed) >= b.cfg.HalfOpenMessages {
				b.set(BreakerClosed, now)
				return recover, true
			}
		}
		return stay, true
	}
	previous := r.PreviousFailure
	if prev, ok := b.latest[id]; ok && prev.at.After(previous) && !prev.requeuedBy(r.Attempt) {
		previous = prev.at
	}
	ownFailure := b.failsOnItsOwn(previous)
	// Its failure is evidence of an outage only when its attempts are
	// unspent and it is not failing on its own: a message whose earlier
	// failure did not count (too many failed at once) is not fresh once
	// the platform has answered others since. Taken as fresh, such retries
	// came back each retry delay as new evidence and, at the end of a
	// burst with little else to send, opened the breaker.
	f := failure{id: id, at: now, seq: b.seq, fresh: r.Fresh && !ownFailure, attempt: r.Attempt}
	b.failures = append(b.failures, f)
	counts = b.state == BreakerClosed && b.evidentlyUp(now) &&
		(ownFailure || !r.Last && (previous.IsZero() || now.Sub(previous) > b.cfg.Window))
	f.counted = counts
	b.latest[id] = f
	if b.state != BreakerOpen && b.judgedDown(now) {
		b.set(BreakerOpen, now)
		return trip, false
	}
	return stay, counts
}

// heldBack records that the failure of row id just observed did not spend
// its attempt after all (the gate held it back: a pause), so that the row's
// next attempt, numbered the same, is not taken for a requeued row's.
func (b *breaker) heldBack(id int64) {
	if f, ok := b.latest[id]; ok {
		f.counted = false
		b.latest[id] = f
	}
}

// observePeerHealthy records that another instance sharing the database
// had a healthy reply at (on this instance's clock, as its announcement
// said at now). A platform that answers other requests is up, whichever
// instance sent them, so the breaker does not open: without it, an
// instance whose own requests were all failures for the silence (with
// three instances, each sees a third of the replies: at the end of a
// burst, the retries of a few failing messages could be all it sent)
// judged the platform down while the others were answered. Failures this
// instance saw after at still count toward opening it.
//
// It makes no attempt count: whether this instance's failures spend
// attempts stays judged from its own replies (evidentlyUp). An instance
// that cannot reach the platform while the others can (its network, its
// proxy) fails every request; taking the others' replies as its own, it
// would spend its rows' attempts and end them FAILED while the platform is
// up.
func (b *breaker) observePeerHealthy(now, at time.Time) {
	if at.After(now) {
		at = now
	}
	b.expire(now)
	if b.state == BreakerOpen || !at.After(b.peerHealthy) {
		return
	}
	b.peerHealthy = at
	for _, f := range b.failures {
		if f.at.After(at) {
			break
		}
		b.peerSeq = max(b.peerSeq, f.seq)
	}
}

// failsOnItsOwn says whether a message that last failed at previous (zero:
// never) fails on its own: the platform has since answered a request sent
// after that failure, so it fails again while others get through.
func (b *breaker) failsOnItsOwn(previous time.Time) bool {
	return !previous.IsZero() && previous.Before(b.healthySent)
}

// evidentlyUp: the platform answered a message within the window, and
// fewer than Messages distinct messages not failing on their own have
// failed since. Retries of messages that fail on their own say nothing of
// the platform: counted here, when they were all that was sent (the end of
// a burst, the rest held behind them), none of their attempts counted.
func (b *breaker) evidentlyUp(now time.Time) bool {
	return !b.lastHealthy.IsZero() && now.Sub(b.lastHealthy) <= b.cfg.Window &&
		b.failingSinceHealthy() < b.cfg.Messages
}

// judgedDown: fresh failures span Messages distinct messages, and nothing
// has been answered for Silence, on this instance or, as announced, on
// another. Retries of messages that have failed on their own are no
// evidence: when they are all that is due (the other messages delivered,
// or held behind them by ordering), nothing else can be answered, and that
// silence says nothing of the platform.
func (b *breaker) judgedDown(now time.Time) bool {
	answered := b.lastHealthy
	if b.peerHealthy.After(answered) {
		answered = b.peerHealthy
	}
	if answered.IsZero() {
		answered = b.first
	}
	return now.Sub(answered) >= b.cfg.Silence && b.failingSince(max(b.healthySeq, b.peerSeq)) >= b.cfg.Messages
}

// failingSinceHealthy counts, up to Messages, the distinct messages not
// failing on their own (fresh) that failed after this instance's last
// healthy reply.
func (b *breaker) failingSinceHealthy() int { return b.failingSince(b.healthySeq) }

// failingSince counts, up to Messages, the distinct fresh messages among
// the failures numbered after seq. It reads the failures newest first and
// stops at Messages, so that it costs a few steps whatever the load.
func (b *breaker) failingSince(seq uint64) int {
	var seen []int64
	for i := len(b.failures) - 1; i >= 0 && b.failures[i].seq > seq; i-- {
		f := b.failures[i]
		if !f.fresh || slices.Contains(seen, f.id) {
			continue
		}
		if seen = append(seen, f.id); len(seen) >= b.cfg.Messages {
			break
		}
	}
	return len(seen)
}

func (b *breaker) expire(now time.Time) {
	cut := 0
	for cut < len(b.failures) && now.Sub(b.failures[cut].at) > b.cfg.Window {
		f := b.failures[cut]
		if l, ok := b.latest[f.id]; ok && l.seq == f.seq {
			delete(b.latest, f.id)
		}
		cut++
	}
	if cut > 0 {
		b.failures = append(b.failures[:0], b.failures[cut:]...)
	}
}

// set moves to state s at now. A new state starts with no failures, so that
// those that opened the breaker do not open it again at once after a probe
// succeeded; a half-open breaker counts the platform as answering from now
// (a probe just succeeded, here or on another instance).
func (b *breaker) set(s BreakerState, now time.Time) {
	if b.state == s {
		return
	}
	b.state = s
	clear(b.latest)
	clear(b.healed)
	b.failures = b.failures[:0]
	if s == BreakerHalfOpen {
		b.lastHealthy, b.healthySeq = now, b.seq
	}
}
