package protection

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// waiting is the number of Acquires waiting for a slot.
func (l *Limiter) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiters.Len()
}

// take acquires n slots, none of which may wait.
func take(t *testing.T, l *Limiter, n int) {
	t.Helper()
	for range n {
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// queue starts an Acquire on ctx in a goroutine and returns once it waits;
// its result arrives on the channel returned.
func queue(t *testing.T, l *Limiter, ctx context.Context) <-chan error {
	t.Helper()
	before := l.waiting()
	done := make(chan error, 1)
	go func() { done <- l.Acquire(ctx) }()
	for l.waiting() == before {
		select {
		case err := <-done:
			t.Fatalf("Acquire returned %v without waiting", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	return done
}

// result is what a queued Acquire returned; a slot never handed over fails
// the test rather than hanging it.
func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter was never handed a slot")
		return nil
	}
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
		take(t, l, 2)
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

	t.Run("EachReleaseHandsItsSlotToTheEarliestWaiterAlone", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(1)
		take(t, l, 1)
		var waiters []<-chan error
		for range 5 {
			waiters = append(waiters, queue(t, l, ctx))
		}
		for i, done := range waiters {
			l.Release()
			if err := result(t, done); err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
			// The release granted one slot: the later waiters all wait on.
			if n, want := l.waiting(), len(waiters)-i-1; n != want {
				t.Fatalf("after release %d: %d waiting, want %d", i+1, n, want)
			}
			for _, later := range waiters[i+1:] {
				select {
				case err := <-later:
					t.Fatalf("after release %d a later waiter returned too (%v)", i+1, err)
				default:
				}
			}
			if n := l.InFlight(); n != 1 {
				t.Fatalf("after release %d: %d in flight, want 1", i+1, n)
			}
		}
	})

	t.Run("ACanceledWaiterLeavesTheQueue", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(1)
		take(t, l, 1)
		actx, cancel := context.WithCancel(ctx)
		a := queue(t, l, actx)
		b := queue(t, l, ctx)
		cancel()
		if err := result(t, a); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled waiter: %v, want context.Canceled", err)
		}
		if n := l.waiting(); n != 1 {
			t.Fatalf("%d waiting after the cancel, want 1", n)
		}
		l.Release()
		if err := result(t, b); err != nil {
			t.Fatalf("next waiter: %v", err)
		}
		if n := l.InFlight(); n != 1 {
			t.Fatalf("%d in flight, want 1", n)
		}
	})

	// A slot handed to a waiter whose context has just ended (woken by the
	// end, it finds the slot when it leaves the queue) goes on to the next
	// waiter: it is neither kept nor lost.
	t.Run("ASlotHandedToAWaiterWhoseContextEndedGoesOn", func(t *testing.T) {
		t.Parallel()
		for i := range 100 {
			l := NewLimiter(1)
			take(t, l, 1)
			actx, cancel := context.WithCancel(ctx)
			a := queue(t, l, actx)
			b := queue(t, l, ctx)
			l.mu.Lock()
			cancel()
			l.inFlight-- // the first slot comes back, as in Release
			l.grantLocked()
			l.mu.Unlock()
			if err := result(t, a); !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: waiter whose context ended: %v, want context.Canceled", i, err)
			}
			if err := result(t, b); err != nil {
				t.Fatalf("round %d: next waiter: %v", i, err)
			}
			if n, w := l.InFlight(), l.waiting(); n != 1 || w != 0 {
				t.Fatalf("round %d: %d in flight and %d waiting, want 1 and 0", i, n, w)
			}
		}
	})

	t.Run("ARaisedLimitGrantsAsManyWaitersAsItFrees", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(5)
		l.Reset(1)
		take(t, l, 1)
		waiters := []<-chan error{queue(t, l, ctx), queue(t, l, ctx), queue(t, l, ctx)}
		l.Reset(3)
		for i, done := range waiters[:2] {
			if err := result(t, done); err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
		}
		if n, w := l.InFlight(), l.waiting(); n != 3 || w != 1 {
			t.Fatalf("%d in flight and %d waiting, want 3 and 1", n, w)
		}
		l.Healthy() // 3 + 1/3: still 3
		if w := l.waiting(); w != 1 {
			t.Fatalf("%d waiting after a rise within the same whole limit, want 1", w)
		}
		for l.Limit() < 4 {
			l.Healthy()
		}
		if err := result(t, waiters[2]); err != nil {
			t.Fatalf("waiter 2: %v", err)
		}
		if n := l.InFlight(); n != 4 {
			t.Fatalf("%d in flight, want 4", n)
		}
	})

	t.Run("AHalvedLimitHoldsWaitersUntilBelowIt", func(t *testing.T) {
		t.Parallel()
		l := NewLimiter(4)
		take(t, l, 4)
		l.Unavailable() // 2
		done := queue(t, l, ctx)
		l.Release()
		l.Release() // 2 in flight: at the limit
		if w := l.waiting(); w != 1 {
			t.Fatalf("%d waiting with the in-flight requests at the halved limit, want 1", w)
		}
		l.Release()
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
		if n := l.InFlight(); n != 2 {
			t.Fatalf("%d in flight, want 2", n)
		}
	})
}

// TestLimiterRequestAllocatesNothing: the limiter is taken and given back
// around every request; with nobody waiting for a slot that allocates
// nothing. (Not parallel: AllocsPerRun counts the whole process.)
func TestLimiterRequestAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	l := NewLimiter(10)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := l.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		l.Healthy()
		l.Release()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations a request, want 0", allocs)
	}
}

// BenchmarkLimiterRampUp is a ramp-up after an outage: the writes of an
// output (max_in_flight: 100 by default, 1 000) contend for a limit of 4,
// each holding its slot for a round trip of 200µs. Its figure is the CPU a
// request costs (cpu-ns/op); the wall time is the round trips'.
func BenchmarkLimiterRampUp(b *testing.B) {
	for _, writers := range []int{100, 1000} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			l := NewLimiter(writers)
			l.Reset(4)
			ctx := context.Background()
			var wg sync.WaitGroup
			var left atomic.Int64
			left.Store(int64(b.N))
			b.ResetTimer()
			start := cpuTime(b)
			for range writers {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						if err := l.Acquire(ctx); err != nil {
							b.Error(err)
							return
						}
						time.Sleep(200 * time.Microsecond)
						l.Release()
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
