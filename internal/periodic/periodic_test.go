package periodic

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// within fails the test when ch is not closed or sent on within a minute:
// a bound for a stuck loop, not a timing the test asserts.
func within[T any](t *testing.T, what string, ch <-chan T) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
	}
}

func TestLoop(t *testing.T) {
	t.Parallel()

	t.Run("RunsEveryInterval", func(t *testing.T) {
		t.Parallel()
		runs := make(chan struct{}, 3)
		l := Start(context.Background(), Config{Interval: time.Millisecond}, func(context.Context) {
			select {
			case runs <- struct{}{}:
			default:
			}
		})
		defer l.Stop()
		for range 3 {
			within(t, "a run", runs)
		}
	})

	t.Run("WithoutNowTheFirstRunWaitsForTheInterval", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int32
		l := Start(context.Background(), Config{Interval: time.Hour}, func(context.Context) { runs.Add(1) })
		l.Stop()
		if n := runs.Load(); n != 0 {
			t.Fatalf("%d runs before the first hour passed, want none", n)
		}
	})

	t.Run("NowRunsAtOnce", func(t *testing.T) {
		t.Parallel()
		ran := make(chan struct{})
		l := Start(context.Background(), Config{Interval: time.Hour, Now: true}, func(context.Context) { close(ran) })
		defer l.Stop()
		within(t, "the first run", ran)
	})

	t.Run("StopCancelsTheRunUnderWayAndWaitsForIt", func(t *testing.T) {
		t.Parallel()
		started, finished := make(chan struct{}), make(chan error, 1)
		l := Start(context.Background(), Config{Interval: time.Hour, Now: true}, func(ctx context.Context) {
			close(started)
			<-ctx.Done()
			finished <- ctx.Err()
		})
		within(t, "the run to start", started)
		l.Stop()
		select {
		case err := <-finished:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the run ended with %v, want context.Canceled", err)
			}
		default:
			t.Fatal("Stop returned before the run under way ended")
		}
		l.Stop() // again: nothing to do
	})

	t.Run("StopWithinGivesUpWaitingWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		started, release := make(chan struct{}), make(chan struct{})
		l := Start(context.Background(), Config{Interval: time.Hour, Now: true}, func(context.Context) {
			close(started)
			<-release // a run that does not heed its context
		})
		within(t, "the run to start", started)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := l.StopWithin(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("StopWithin = %v, want the context's error while the run goes on", err)
		}
		close(release)
		l.Stop()
	})

	t.Run("TheParentContextEndsTheLoop", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		l := Start(ctx, Config{Interval: time.Millisecond}, func(context.Context) {})
		cancel()
		within(t, "the loop to end", l.done)
	})

	t.Run("ANilLoopStops", func(t *testing.T) {
		t.Parallel()
		var l *Loop
		l.Stop()
		if err := l.StopWithin(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
