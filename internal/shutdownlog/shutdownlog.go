// Package shutdownlog says in the log what a component's shutdown is
// waiting for. Benthos stops a stream in order (inputs wait for the
// acknowledgement of what they handed out, then the pipeline and the
// outputs finish) and past three quarters of shutdown_timeout it stops
// everything hard: an exit that takes that long is explained only if the
// components say what they are waiting for while they wait.
package shutdownlog

import (
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
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

	once sync.Once
	mu   sync.Mutex
	stop chan struct{}
	done chan struct{}
}

// New returns a watch that logs to log what waiting describes.
func New(log *service.Logger, interval time.Duration, waiting func() string) *Watch {
	return &Watch{log: log, interval: interval, waiting: waiting}
}

// Start begins the report (once; later calls do nothing): it logs what is
// awaited now, if anything, and again every interval, with the time since
// Start, until Stop or until nothing is awaited any more.
func (w *Watch) Start() {
	w.once.Do(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.stop != nil {
			return // stopped before it started
		}
		w.stop, w.done = make(chan struct{}), make(chan struct{})
		started := time.Now()
		if what := w.waiting(); what != "" {
			w.log.Infof("Shutting down: waiting for %s", what)
		} else {
			close(w.done)
			return
		}
		go func() {
			defer close(w.done)
			t := time.NewTicker(w.interval)
			defer t.Stop()
			for {
				select {
				case <-w.stop:
					return
				case <-t.C:
				}
				what := w.waiting()
				if what == "" {
					return
				}
				w.log.Infof("Shutting down: still waiting, after %s, for %s", time.Since(started).Round(time.Second), what)
			}
		}()
	})
}

// Stop ends the report and waits for its goroutine. Safe to call more than
// once and without Start.
func (w *Watch) Stop() {
	w.mu.Lock()
	if w.stop == nil {
		// Stopped before it started: Start will do nothing.
		w.stop = make(chan struct{})
		close(w.stop)
		w.mu.Unlock()
		return
	}
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	done := w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
}
