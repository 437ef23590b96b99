// Package periodic runs background work at an interval: one goroutine, a
// ticker, a context that Stop cancels and Stop waiting for the run under
// way. Every periodic loop of the forwarder (lease renewal, compensation,
// order repair, the platform gate's shared-state reads, the record gauges,
// partition upkeep and retention, Kafka commits, mapping reloads, shutdown
// reports) starts and stops through it, as River's services share one
// start/stop base, so that each is only its work and its interval.
package periodic

import (
	"context"
	"time"
)

// Config says when the work runs.
type Config struct {
	// Interval is the time between two runs; it must be positive. A run
	// that takes longer than Interval delays the next one (ticks are not
	// queued).
	Interval time.Duration
	// Now runs the work once as soon as the loop starts, before the first
	// interval has passed.
	Now bool
}

// Loop is work running at an interval. A nil *Loop never ran: Stop
// returns at once.
type Loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs run on a goroutine of its own every cfg.Interval until Stop or
// until ctx ends. run gets a context that ends then, so that a run under
// way (a statement, a wait) is cut short by Stop.
func Start(ctx context.Context, cfg Config, run func(ctx context.Context)) *Loop {
	if cfg.Interval <= 0 {
		panic("periodic: the interval must be positive")
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Loop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		if cfg.Now {
			run(ctx)
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			run(ctx)
		}
	}()
	return l
}

// Stop cancels the run under way, if any, and waits for the loop to end.
// Safe to call more than once, and on a nil *Loop.
func (l *Loop) Stop() {
	_ = l.StopWithin(context.Background())
}

// StopWithin is Stop that stops waiting when ctx ends, with ctx's error
// (Benthos gives Close a deadline); the loop still ends once its run
// returns.
func (l *Loop) StopWithin(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.cancel()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
