package dispatch

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	cfg := BreakerConfig{Window: 10 * time.Second, MinReplies: 10, Ratio: 0.5, Consecutive: 5, HalfOpenReplies: 3}

	t.Run("MostRepliesUnavailableOpensIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// Alternating replies: half unavailable, never four in a row.
		for i := range 9 {
			if tr := b.observe(t0.Add(time.Duration(i)*time.Millisecond), i%2 == 0); tr != stay {
				t.Fatalf("reply %d (of fewer than min_replies) moved the breaker: %v", i, tr)
			}
		}
		if tr := b.observe(t0.Add(10*time.Millisecond), true); tr != trip || b.state != BreakerOpen {
			t.Fatalf("10th reply, 6 of 10 unavailable: %v, state %v; want it open", tr, b.state)
		}
	})

	t.Run("HealthyErrorsNeverOpenIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// errcode 999 is a reply the platform made on purpose: healthy,
		// however many there are (the caller reports them as healthy).
		for i := range 1000 {
			unavailable := i%10 < 3 && i%10 != 1 // 20 % unavailable, never two in a row
			if tr := b.observe(t0.Add(time.Duration(i)*time.Millisecond), unavailable); tr != stay {
				t.Fatalf("reply %d: %v with a 20%% unavailable platform", i, tr)
			}
		}
		if b.down(t0.Add(time.Second)) {
			t.Fatal("judged down")
		}
	})

	t.Run("ARandomThirdUnavailableNeverOpensItUnderLoad", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		rnd := rand.New(rand.NewPCG(1, 2))
		for i := range 20_000 { // 2 000 replies a second
			if tr := b.observe(t0.Add(time.Duration(i)*500*time.Microsecond), rnd.Float64() < 0.3); tr != stay {
				t.Fatalf("reply %d: %v with a platform failing 30%% of requests at random", i, tr)
			}
		}
	})

	t.Run("ARunOfUnavailableRepliesOpensItUnderLightLoad", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		for i := range 4 {
			b.observe(t0.Add(time.Duration(i)*time.Second), true)
		}
		if tr := b.observe(t0.Add(4*time.Second), true); tr != trip {
			t.Fatalf("5 unavailable replies in a row: %v", tr)
		}
	})

	t.Run("OldRepliesLeaveTheWindow", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		for i := range 8 { // 4 of 8 unavailable, below min_replies
			b.observe(t0, i%2 == 0)
		}
		// Past the window the old replies are gone: 5 of 10 would have
		// opened it.
		late := t0.Add(11 * time.Second)
		b.observe(late, true)
		if tr := b.observe(late, false); tr != stay || b.down(late) {
			t.Fatalf("replies older than the window still count: %v, down %v", tr, b.down(late))
		}
		if n := len(b.replies); n != 2 {
			t.Fatalf("%d replies kept, want the 2 recent ones", n)
		}
	})

	t.Run("TheLatestRepliesSayDownBeforeTheBreakerOpens", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		for i := range 300 { // 30 s of healthy traffic, window full
			b.observe(t0.Add(time.Duration(i)*33*time.Millisecond), false)
		}
		at := t0.Add(10 * time.Second)
		for i := range 10 { // the outage begins
			if tr := b.observe(at, true); tr != stay {
				t.Fatalf("reply %d of the outage opened the breaker already: the window is mostly healthy", i)
			}
		}
		if !b.down(at) {
			t.Fatal("10 unavailable replies in a row are not judged down: a row on its last attempt would fail")
		}
	})

	t.Run("TwoUnavailableRepliesInARowSayDownUnderLightLoad", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.observe(t0, false)
		b.observe(t0, true)
		if b.down(t0) {
			t.Fatal("one unavailable reply is judged down")
		}
		b.observe(t0, true)
		if !b.down(t0) {
			t.Fatal("two unavailable replies in a row, few replies in the window: not judged down, so a row on its last attempt would fail")
		}
		if b.state != BreakerClosed {
			t.Fatalf("two unavailable replies opened the breaker: %v", b.state)
		}
		b.observe(t0, false)
		if b.down(t0) {
			t.Fatal("still judged down after a healthy reply")
		}
	})

	t.Run("HalfOpenClosesAfterHealthyRepliesAndReopensOnAFailure", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.set(BreakerHalfOpen)
		if !b.down(t0) {
			t.Fatal("half-open is not judged down")
		}
		b.observe(t0, false)
		b.observe(t0, false)
		if tr := b.observe(t0, false); tr != recover || b.state != BreakerClosed {
			t.Fatalf("3rd healthy reply in half-open: %v %v", tr, b.state)
		}
		b.set(BreakerHalfOpen)
		b.observe(t0, false)
		if tr := b.observe(t0, true); tr != trip || b.state != BreakerOpen {
			t.Fatalf("unavailable reply in half-open: %v %v", tr, b.state)
		}
	})
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AdditiveIncreaseMultiplicativeDecrease", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(100)
		now := time.Unix(0, 0)
		l.now = func() time.Time { return now }
		l.Unavailable()
		if got := l.Limit(); got != 50 {
			t.Fatalf("after one unavailable reply: %d, want 50", got)
		}
		l.Unavailable() // same burst
		if got := l.Limit(); got != 50 {
			t.Fatalf("a second cut within %v: %d, want still 50", cutInterval, got)
		}
		now = now.Add(cutInterval)
		l.Unavailable()
		if got := l.Limit(); got != 25 {
			t.Fatalf("after a second burst: %d, want 25", got)
		}
		l.Reset(1)
		replies := 0
		for l.Limit() < 10 {
			l.Healthy()
			replies++
		}
		// From 1 to 10 one step per limit's worth of replies: about 45, a
		// ramp, not a jump.
		if replies < 40 || replies > 50 {
			t.Fatalf("%d healthy replies took the limit from 1 to 10, want about 45", replies)
		}
		for range 100_000 {
			l.Healthy()
		}
		if got := l.Limit(); got != 100 {
			t.Fatalf("limit %d after many healthy replies, want the maximum 100", got)
		}
	})

	t.Run("AcquireWaitsForTheLimit", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(2)
		for range 2 {
			if err := l.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
		}
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := l.Acquire(tctx); err == nil {
			t.Fatal("a third slot with a limit of 2")
		}
		got := make(chan error, 1)
		go func() { got <- l.Acquire(ctx) }()
		time.Sleep(10 * time.Millisecond)
		l.Release()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		l.Reset(1) // two in flight, limit 1: nobody new until both are back
		l.Release()
		tctx2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel2()
		if err := l.Acquire(tctx2); err == nil {
			t.Fatal("a slot beyond a lowered limit")
		}
	})

	t.Run("AcquireAfterTheContextEndedFails", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(2)
		done, cancel := context.WithCancel(ctx)
		cancel()
		// A slot is free, but a stopping output must start no new request.
		if err := l.Acquire(done); err == nil {
			t.Fatal("a slot taken with an ended context")
		}
		if l.InFlight() != 0 {
			t.Fatalf("%d in flight after a refused acquire", l.InFlight())
		}
	})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	if NewRateLimit(0, nil).Wait(context.Background()) != nil {
		t.Fatal("no limit must never wait")
	}
	// A fake shared bucket: rate 100/s, tokens given out only as time
	// allows; the limit must take them in chunks of 10.
	var asked []int
	start := time.Now()
	var taken float64
	r := NewRateLimit(100, func(_ context.Context, n int, rate, burst float64) (bool, time.Duration, error) {
		asked = append(asked, n)
		avail := min(burst, time.Since(start).Seconds()*rate) - taken + burst
		if avail >= float64(n) {
			taken += float64(n)
			return true, 0, nil
		}
		return false, time.Duration((float64(n) - avail) / rate * float64(time.Second)), nil
	})
	for range 150 {
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// 150 requests: the first 100 from the full bucket, 50 more at 100/s.
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("150 requests at 100/s with a bucket of 100 took %v, want about half a second", took)
	}
	for _, n := range asked {
		if n != 10 {
			t.Fatalf("asked the database for %v tokens, want chunks of 10", asked)
		}
	}
	if len(asked) < 15 {
		t.Errorf("asked %d times for 150 tokens", len(asked))
	}
}
