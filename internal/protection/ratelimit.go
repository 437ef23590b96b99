package protection

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// RateLimit caps the requests per second to the platform across every
// instance sharing the database: a token bucket kept in PostgreSQL
// (forward_platform_state), taken in chunks of a tenth of a second's worth
// so that an instance asks the database about ten times a second, not once
// per request, and spent locally one token per request.
type RateLimit struct {
	rate  float64
	chunk int
	burst float64
	take  func(ctx context.Context, n int, rate, burst float64) (bool, time.Duration, error)

	mu     sync.Mutex
	tokens int
	// refill is held by the one caller asking the database; the others wait
	// on it.
	refill chan struct{}
}

// maxRateChunk bounds the tokens taken at a time, so that a rate too high
// to ever bind still converts to a whole number of them.
const maxRateChunk = 1 << 20

// NewRateLimit returns a limit of rate requests per second (0: none),
// taking tokens with take (outboxdb.TakeRateTokens on a pool). The bucket
// holds one second's worth: an idle cluster may send a burst of that many.
func NewRateLimit(rate float64, take func(ctx context.Context, n int, rate, burst float64) (bool, time.Duration, error)) *RateLimit {
	if rate <= 0 {
		return nil
	}
	chunk := max(int(min(math.Ceil(rate/10), maxRateChunk)), 1)
	return &RateLimit{rate: rate, chunk: chunk, burst: max(rate, float64(chunk)), take: take}
}

// Wait takes one token, waiting until the cluster's bucket has some. A nil
// RateLimit never waits. When the database cannot be asked, it waits a
// chunk's worth of time and sends: the limit protects the platform, it must
// not stop delivery when PostgreSQL hiccups.
func (r *RateLimit) Wait(ctx context.Context) error {
	if r == nil {
		return nil
	}
	for {
		r.mu.Lock()
		if r.tokens > 0 {
			r.tokens--
			r.mu.Unlock()
			return nil
		}
		if r.refill != nil {
			wait := r.refill
			r.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		r.refill = make(chan struct{})
		r.mu.Unlock()

		got, err := r.fill(ctx)
		r.mu.Lock()
		r.tokens += got
		close(r.refill)
		r.refill = nil
		r.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// fill takes a chunk from the shared bucket, waiting for it.
func (r *RateLimit) fill(ctx context.Context) (int, error) {
	for {
		ok, wait, err := r.take(ctx, r.chunk, r.rate, r.burst)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			wait = outboxdb.RateWait(float64(r.chunk), r.rate)
			if err := sleep(ctx, wait); err != nil {
				return 0, err
			}
			return r.chunk, nil
		}
		if ok {
			return r.chunk, nil
		}
		if err := sleep(ctx, max(wait, time.Millisecond)); err != nil {
			return 0, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
