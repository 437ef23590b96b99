// Package shutdownlog says in the log what a component's shutdown is
// waiting for. Benthos stops a stream in order (inputs wait for the
// acknowledgement of what they handed out, then the pipeline and the
// outputs finish) and past three quarters of shutdown_timeout it stops
// everything hard: an exit that takes that long is explained only if the
// components say what they are waiting for while they wait.
package shutdownlog

import (
	"context"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/periodic"
)

// Interval is how often a wait that goes on is logged again.
const Interval = 5 * time.Second

// Watch is one component's shutdown report: Start logs what the component
// waits for, at once and again every interval while it still waits, until
// Stop. The zero value is not usable; use New.
type Watch struct {
	log      *service.Logger
	interval time.Duration
	// waiting describes what is still awaited, "" when nothing is.
	waiting func() string

	once    sync.Once
	mu      sync.Mutex
	stopped bool
	loop    *periodic.Loop
}

// New returns a watch that logs to log what waiting describes.
func New(log *service.Logger, interval time.Duration, waiting func() string) *Watch {
	return &Watch{log: log, interval: interval, waiting: waiting}
}

// Start begins the report (once; later calls do nothing): it logs what is
// awaited now, if anything, and again every interval while something is,
// with the time since Start, until Stop.
func (w *Watch) Start() {
	w.once.Do(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.stopped {
			return
		}
		what := w.waiting()
		if what == "" {
			return
		}
		w.log.Infof("Shutting down: waiting for %s", what)
		started := time.Now()
		w.loop = periodic.Start(context.Background(), periodic.Config{Interval: w.interval}, func(context.Context) {
			if what := w.waiting(); what != "" {
				w.log.Infof("Shutting down: still waiting, after %s, for %s", time.Since(started).Round(time.Second), what)
			}
		})
	})
}

// Stop ends the report and waits for its goroutine. Safe to call more than
// once and without Start; a Start after Stop does nothing.
func (w *Watch) Stop() {
	w.mu.Lock()
	w.stopped = true
	loop := w.loop
	w.mu.Unlock()
	loop.Stop()
}
