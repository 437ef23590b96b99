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
//
// What a component holds outside the process (a Kafka consumer group's
// membership) would outlive such an exit until the broker times it out: the
// component registers its release with OnCancel, and the exit runs Abandon.
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
	// onCancel are the releases Abandon runs, by registration number.
	onCancel    map[int]func(context.Context)
	nextRelease int
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

// Cancelled reports whether Cancel shut the gate: the process is ending
// before it started, and a component must not take anything new (a Kafka
// input asked to connect again must not join its group again).
func (g *Gate) Cancelled() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut
}

// OnCancel registers release to be run by Abandon should the process end
// before it has started, and returns the function that unregisters it (for
// the component's Close). Once the gate is open nothing is registered: the
// process then stops through its components' Close.
func (g *Gate) OnCancel(release func(ctx context.Context)) (forget func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		return func() {}
	default:
	}
	if g.onCancel == nil {
		g.onCancel = map[int]func(context.Context){}
	}
	id := g.nextRelease
	g.nextRelease++
	g.onCancel[id] = release
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.onCancel, id)
	}
}

// Abandon runs every release registered with OnCancel, all at once, and
// returns when they have all returned or ctx has ended. The process calls
// it after Cancel reported true, just before it exits.
func (g *Gate) Abandon(ctx context.Context) {
	g.mu.Lock()
	releases := make([]func(context.Context), 0, len(g.onCancel))
	for _, r := range g.onCancel {
		releases = append(releases, r)
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range releases {
		wg.Go(func() { r(ctx) })
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
