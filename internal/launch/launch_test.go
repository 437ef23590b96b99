package launch

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGate(t *testing.T) {
	t.Run("NotHeldLetsThrough", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		g := NewGate()
		if err := g.Wait(ctx); err != nil || !g.Ready() {
			t.Fatalf("a gate nobody holds: Wait %v, Ready %v; want nil even with ctx done, and ready", err, g.Ready())
		}
	})
	t.Run("HeldWaitsForOpen", func(t *testing.T) {
		g := NewGate()
		g.Hold()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) || g.Ready() {
			t.Fatalf("a held gate: Wait %v, Ready %v; want it to block until ctx ends, and not ready", err, g.Ready())
		}
		done := make(chan error, 1)
		go func() { done <- g.Wait(context.Background()) }()
		g.Open()
		if err := <-done; err != nil {
			t.Fatalf("Wait after Open: %v", err)
		}
		if !g.Ready() {
			t.Fatal("an open gate is not ready")
		}
		g.Open() // opening twice is harmless
		if err := g.Wait(context.Background()); err != nil {
			t.Fatalf("Wait on an open gate: %v", err)
		}
	})
}
