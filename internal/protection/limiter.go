package protection

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// Limiter bounds the requests in flight to the platform with a limit that
// adapts between 1 and a maximum, additive increase, multiplicative
// decrease (AIMD, as TCP congestion control): each healthy reply raises the
// limit by 1/limit (about one more request per round trip), an unavailable
// one halves it, at most once per cutInterval so that one burst of failures
// halves it once. After an outage it starts from one and ramps up instead
// of sending the whole backlog at a platform that has just come back.
//
// Waiters are served in the order they came, each woken only when a slot is
// handed to it (as golang.org/x/sync/semaphore does; its fixed size cannot
// follow the limit): during a ramp-up after an outage max_in_flight writes
// wait on a limit of a few, and a release wakes one of them, not all.
type Limiter struct {
	max int
	// OnChange, when set, is called with the limit and the free slots after
	// every change (for the gauges), under the limiter's lock.
	OnChange func(limit, free int)

	mu       sync.Mutex
	limit    float64
	inFlight int
	lastCut  time.Time
	// waiters holds a channel per waiting Acquire, first come first; a
	// slot is counted in inFlight when it is handed over, then the
	// channel is closed.
	waiters list.List
	now     func() time.Time
}

// cutInterval is the shortest time between two halvings.
const cutInterval = 200 * time.Millisecond

// NewLimiter returns a limiter at its maximum.
func NewLimiter(max int) *Limiter {
	return &Limiter{max: max, limit: float64(max), now: time.Now}
}

// Acquire takes a slot, waiting while the limit is reached; it fails when
// ctx ends before it is handed one, and at once when ctx has ended already,
// even if a slot is free: a stopping output starts no new request.
func (l *Limiter) Acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.waiters.Len() == 0 && l.inFlight < l.current() {
		l.inFlight++
		l.changedLocked()
		l.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	elem := l.waiters.PushBack(ready)
	l.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		select {
		case <-ready:
			// Handed a slot as ctx ended: it goes to the next waiter.
			l.inFlight--
			l.grantLocked()
		default:
			l.waiters.Remove(elem)
		}
		l.mu.Unlock()
		return ctx.Err()
	}
}

// Release gives a slot back.
func (l *Limiter) Release() {
	l.mu.Lock()
	l.inFlight--
	l.grantLocked()
	l.mu.Unlock()
}

// Healthy raises the limit after a reply that shows the platform up.
func (l *Limiter) Healthy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	before := l.current()
	l.limit = min(l.limit+1/l.limit, float64(l.max))
	if l.current() != before {
		l.grantLocked()
	}
}

// Unavailable halves the limit after a reply that shows the platform down.
func (l *Limiter) Unavailable() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := l.now(); now.Sub(l.lastCut) >= cutInterval {
		l.lastCut = now
		l.limit = max(l.limit/2, 1)
		l.changedLocked()
	}
}

// Reset sets the limit (clamped to 1..max): 1 when the platform comes back.
func (l *Limiter) Reset(limit int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limit = float64(min(max(limit, 1), l.max))
	l.grantLocked()
}

// Limit is the current limit; InFlight the slots taken.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current()
}

// InFlight is the number of slots taken.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight
}

// Max is the largest limit.
func (l *Limiter) Max() int { return l.max }

func (l *Limiter) current() int { return int(l.limit) }

// grantLocked hands the free slots to the first waiters, one each.
func (l *Limiter) grantLocked() {
	for l.inFlight < l.current() && l.waiters.Len() > 0 {
		l.inFlight++
		close(l.waiters.Remove(l.waiters.Front()).(chan struct{}))
	}
	l.changedLocked()
}

func (l *Limiter) changedLocked() {
	if l.OnChange != nil {
		l.OnChange(l.current(), max(l.current()-l.inFlight, 0))
	}
}
