// Package launch tells the components that claim outbox rows when the
// forwarder process has finished starting.
//
// Benthos installs its SIGTERM handler only after the stream is built, while
// the stream's inputs already run: a SIGTERM in between ends the process at
// once (Go's default action), without the graceful stop that finishes or
// gives back every claim (docs/guarantees.md #7). The forwarder's command
// therefore holds claims until the stream has started; a component built any
// other way (a test, another program) is never held.
package launch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Gate opens once. Wait blocks until then, but only if the gate was held.
type Gate struct {
	held atomic.Bool
	once sync.Once
	open chan struct{}
}

// NewGate returns a gate that nobody holds: Wait returns at once until Hold.
func NewGate() *Gate { return &Gate{open: make(chan struct{})} }

// Process is this process's gate: cmd/forwarder holds it before the stream
// is built and opens it once Benthos listens for SIGTERM.
var Process = NewGate()

// Hold makes Wait block until Open.
func (g *Gate) Hold() { g.held.Store(true) }

// Open lets every Wait, present and future, through.
func (g *Gate) Open() { g.once.Do(func() { close(g.open) }) }

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
	if !g.held.Load() {
		return nil
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
