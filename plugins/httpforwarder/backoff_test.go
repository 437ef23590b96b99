package httpforwarder

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := backoff{initial: 5 * time.Second, max: 300 * time.Second, multiplier: 2, jitter: 0.1}
	rng := rand.New(rand.NewPCG(1, 2))
	for attempt := 1; attempt <= 12; attempt++ {
		base := min(5*time.Second<<(attempt-1), 300*time.Second)
		lo := time.Duration(float64(base) * 0.9)
		hi := min(time.Duration(float64(base)*1.1), b.max)
		// The extremes of the band, its middle, and random draws.
		draws := []float64{0, 0.5, 0.999999999}
		for range 500 {
			draws = append(draws, rng.Float64())
		}
		var seenLow, seenHigh bool
		for _, r := range draws {
			d := b.delay(attempt, r)
			if d < lo || d > hi {
				t.Fatalf("attempt %d, rnd %v: delay %v outside [%v, %v]", attempt, r, d, lo, hi)
			}
			seenLow = seenLow || d < base
			seenHigh = seenHigh || d > base
		}
		if !seenLow || (!seenHigh && base < b.max) {
			t.Errorf("attempt %d: jitter did not spread both ways around %v", attempt, base)
		}
		if got := b.delay(attempt, 0.5); got != base {
			t.Errorf("attempt %d: centre of the band = %v, want %v", attempt, got, base)
		}
	}

	noJitter := backoff{initial: time.Second, max: time.Minute, multiplier: 3}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 3 * time.Second, 3: 9 * time.Second, 4: 27 * time.Second, 5: time.Minute, 1000: time.Minute} {
		if got := noJitter.delay(attempt, 0.123); got != want {
			t.Errorf("no jitter, attempt %d: %v, want %v", attempt, got, want)
		}
	}
}

// TestBackoffDelayAtTheLargestMax: FORWARD_RETRY_MAX at the largest
// duration accepted waits that long, never a negative delay.
func TestBackoffDelayAtTheLargestMax(t *testing.T) {
	t.Parallel()
	longest := time.Duration(math.MaxInt64)
	b := backoff{initial: 5 * time.Second, max: longest, multiplier: 2, jitter: 0.1}
	for _, attempt := range []int{1, 60, 61, 62, 100, 1000} {
		for _, r := range []float64{0, 0.5, 0.999999999} {
			if d := b.delay(attempt, r); d <= 0 || d > longest {
				t.Fatalf("attempt %d, rnd %v: delay %v", attempt, r, d)
			}
		}
	}
	if d := b.delay(1000, 0.5); d != longest {
		t.Errorf("attempt 1000: %v, want the maximum", d)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 21, 10, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"7", 7 * time.Second, true},
		{" 0 ", 0, true},
		{"Thu, 21 May 2026 10:31:00 GMT", time.Minute, true},
		{"Thu, 21 May 2026 10:29:00 GMT", 0, true}, // in the past: now
		{"", 0, false},
		{"-3", 0, false},
		{"soon", 0, false},
		{"1.5", 0, false},
	} {
		got, ok := retryAfter(tc.header, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tc.header, got, ok, tc.want, tc.ok)
		}
	}
	if !honoursRetryAfter(429) || !honoursRetryAfter(503) || honoursRetryAfter(500) || honoursRetryAfter(200) {
		t.Error("Retry-After must be honoured on 429 and 503 only")
	}
}
