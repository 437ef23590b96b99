package dispatch

import (
	"cmp"
	"time"
)

// BreakerState is the circuit breaker's state; the numbers are those of the
// gauge forwarder_platform_breaker_state.
type BreakerState int

const (
	// BreakerClosed: requests flow.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: a probe succeeded; requests flow again with
	// concurrency ramping up from one, and one unavailable reply opens the
	// breaker again.
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
	// Window is how far back replies count. Default 10s.
	Window time.Duration
	// MinReplies is how many replies the window needs before their ratio
	// may open the breaker. Default 10.
	MinReplies int
	// Ratio of unavailable replies in the window that opens it. Default 0.5.
	Ratio float64
	// Consecutive unavailable replies open it while the window holds fewer
	// than MinReplies (a platform that went down under a light load); under
	// load the ratio decides, so that a platform failing a third of its
	// requests at random does not make the breaker flap. Default 5.
	Consecutive int
	// HalfOpenReplies is how many healthy replies in a row close a
	// half-open breaker. Default 10.
	HalfOpenReplies int
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	c.Window = cmp.Or(c.Window, 10*time.Second)
	c.MinReplies = cmp.Or(c.MinReplies, 10)
	c.Ratio = cmp.Or(c.Ratio, 0.5)
	c.Consecutive = cmp.Or(c.Consecutive, 5)
	c.HalfOpenReplies = cmp.Or(c.HalfOpenReplies, 10)
	return c
}

// breaker is one instance's judgement of the platform from the replies it
// sees: a window of recent replies and the state. It does no I/O and keeps
// no clock (the caller passes now), so it is tested as a plain value. The
// Gate shares its decisions with the other instances through PostgreSQL.
type breaker struct {
	cfg BreakerConfig
	// replies in the window, oldest first.
	replies     []reply
	unavailable int
	consecutive int
	state       BreakerState
	halfOpenOK  int
}

type reply struct {
	at   time.Time
	down bool
}

func newBreaker(cfg BreakerConfig) *breaker { return &breaker{cfg: cfg.withDefaults()} }

// transition is what a reply made the breaker do.
type transition int

const (
	stay    transition = iota
	trip               // open it
	recover            // close it (from half-open)
)

// observe records a reply to an ordinary request (not a probe).
func (b *breaker) observe(now time.Time, unavailable bool) transition {
	b.expire(now)
	b.replies = append(b.replies, reply{at: now, down: unavailable})
	if unavailable {
		b.unavailable++
		b.consecutive++
	} else {
		b.consecutive = 0
	}
	switch b.state {
	case BreakerClosed:
		if b.judgedDown() {
			b.set(BreakerOpen)
			return trip
		}
	case BreakerHalfOpen:
		if unavailable {
			b.set(BreakerOpen)
			return trip
		}
		if b.halfOpenOK++; b.halfOpenOK >= b.cfg.HalfOpenReplies {
			b.set(BreakerClosed)
			return recover
		}
	}
	return stay
}

// judgedDown: most recent replies were unavailable.
func (b *breaker) judgedDown() bool {
	n := len(b.replies)
	if n < b.cfg.MinReplies {
		return b.consecutive >= b.cfg.Consecutive
	}
	return float64(b.unavailable) >= b.cfg.Ratio*float64(n)
}

// down says whether the platform must be treated as down now: the breaker
// is not closed, or the latest replies already say so. An unavailable reply
// then never makes its row FAILED. Unlike the opening of the breaker (a
// ratio over the whole window, so that random errors under load never make
// it flap), this looks at the last MinReplies replies only: at the start of
// an outage the window is still full of healthy replies for seconds, and a
// row with short retry delays could use all its attempts meanwhile. Two
// unavailable replies in a row say so too: under light load, or on one of
// several instances, the window fills too slowly for the ratio, and a row
// whose attempts all met the first second of an outage would fail. Being
// wrong here only retries a row once more without counting the attempt.
func (b *breaker) down(now time.Time) bool {
	b.expire(now)
	if b.state != BreakerClosed || b.judgedDown() || b.consecutive >= 2 {
		return true
	}
	n := len(b.replies)
	if n < b.cfg.MinReplies {
		return false
	}
	recent := 0
	for _, r := range b.replies[n-b.cfg.MinReplies:] {
		if r.down {
			recent++
		}
	}
	return float64(recent) >= b.cfg.Ratio*float64(b.cfg.MinReplies)
}

func (b *breaker) expire(now time.Time) {
	cut := 0
	for cut < len(b.replies) && now.Sub(b.replies[cut].at) > b.cfg.Window {
		if b.replies[cut].down {
			b.unavailable--
		}
		cut++
	}
	if cut > 0 {
		b.replies = append(b.replies[:0], b.replies[cut:]...)
	}
}

// set moves to state s; a new state starts with a clean window, so that
// the replies that opened the breaker do not open it again at once after a
// probe succeeded.
func (b *breaker) set(s BreakerState) {
	if b.state == s {
		return
	}
	b.state = s
	b.halfOpenOK = 0
	b.replies = b.replies[:0]
	b.unavailable, b.consecutive = 0, 0
}
