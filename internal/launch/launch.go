// Package launch tells the components that claim outbox rows when the
// forwarder process has finished starting.
//
// Benthos installs its SIGTERM handler only after the stream is built, while
// the stream's inputs already run: a SIGTERM in between ends the process at
// once (Go's default action), without the graceful stop that finishes or
// gives back every claim (docs/guarantees.md #7). The forwarder's command
// therefore holds claims until the stream has started, and a signal that
// comes first cancels the gate and ends the process with nothing held; a
// component built any other way (a test, another program) is never held.
package launch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Gate opens once, unless it was cancelled first. Wait blocks until it
// opens, but only if the gate was held.
type Gate struct {
	held atomic.Bool
	mu   sync.Mutex
	// shut is set by Cancel: the gate never opens.
	shut bool
	open chan struct{}
}

// NewGate returns a gate that nobody holds: Wait returns at once until Hold.
func NewGate() *Gate { return &Gate{open: make(chan struct{})} }

// Process is this process's gate: cmd/forwarder holds it before the stream
// is built and opens it once Benthos listens for SIGTERM.
var Process = NewGate()

// Hold makes Wait block until Open.
func (g *Gate) Hold() { g.held.Store(true) }

// Open lets every Wait, present and future, through, unless the gate was
// cancelled; it reports whether the gate is open.
func (g *Gate) Open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return false
	}
	select {
	case <-g.open:
	default:
		close(g.open)
	}
	return true
}

// Cancel keeps a gate that is not yet open shut for good and reports true:
// nothing has passed it, nor will. On an open gate it does nothing and
// reports false.
func (g *Gate) Cancel() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		return false
	default:
		g.shut = true
		return true
	}
}

// Ready reports whether Wait would return at once: the gate is open or was
// never held.
func (g *Gate) Ready() bool {
	if !g.held.Load() {
		return true
	}
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}

// Wait returns nil once the gate is open or was never held, and ctx's error
// if ctx ends first.
func (g *Gate) Wait(ctx context.Context) error {
	if g.Ready() {
		return nil
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
