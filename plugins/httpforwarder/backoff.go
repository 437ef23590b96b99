package httpforwarder

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// backoff is the retry schedule (docs/configuration.md#platform-responses): the delay before attempt n+1
// is min(initial × multiplier^(n−1), max), moved by up to ±jitter of itself
// and never beyond max.
type backoff struct {
	initial, max time.Duration
	multiplier   float64
	jitter       float64
}

// delay is the wait after failed attempt number attempt (1-based); rnd is a
// uniform random number in [0, 1) that places it within the jitter band.
func (b backoff) delay(attempt int, rnd float64) time.Duration {
	d := float64(b.initial) * math.Pow(b.multiplier, float64(max(attempt, 1)-1))
	if math.IsInf(d, 0) || math.IsNaN(d) || d > float64(b.max) {
		d = float64(b.max)
	}
	d *= 1 + b.jitter*(2*rnd-1)
	if d >= float64(b.max) {
		// Exactly max: the largest Duration, as a float64, rounds above
		// itself, and converted back it was negative (a retry at once).
		return b.max
	}
	return time.Duration(max(d, 0))
}

// retryAfter reads a Retry-After header, in seconds or as an HTTP date, as a
// wait from now. ok is false when the header is missing or unreadable.
func retryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// honoursRetryAfter says whether a status's Retry-After replaces the
// computed delay (429 and 503, docs/configuration.md#platform-responses).
func honoursRetryAfter(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}
