package launch

import (
	"context"
	"errors"
	"sync"
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
		if !g.Open() { // opening twice is harmless
			t.Fatal("Open on an open gate reports it shut")
		}
		if err := g.Wait(context.Background()); err != nil {
			t.Fatalf("Wait on an open gate: %v", err)
		}
		if g.Cancel() {
			t.Fatal("Cancel on an open gate reports it shut")
		}
		if !g.Ready() {
			t.Fatal("Cancel shut an open gate")
		}
	})
	t.Run("CancelledNeverOpens", func(t *testing.T) {
		g := NewGate()
		g.Hold()
		if !g.Cancel() {
			t.Fatal("Cancel on a shut gate reports it open")
		}
		if g.Open() || g.Ready() {
			t.Fatalf("a cancelled gate opened: Open reported true or Ready %v", g.Ready())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on a cancelled gate: %v, want it to block until ctx ends", err)
		}
	})
	t.Run("AbandonRunsTheReleasesStillRegistered", func(t *testing.T) {
		g := NewGate()
		g.Hold()
		var ran []string
		var mu sync.Mutex
		release := func(name string) func(context.Context) {
			return func(context.Context) {
				mu.Lock()
				defer mu.Unlock()
				ran = append(ran, name)
			}
		}
		g.OnCancel(release("kept"))
		forget := g.OnCancel(release("closed"))
		// Its component closed normally.
		forget()
		// A release that hangs (a broker that does not answer).
		g.OnCancel(func(ctx context.Context) { <-ctx.Done() })
		if g.Cancelled() {
			t.Fatal("Cancelled before Cancel")
		}
		if !g.Cancel() || !g.Cancelled() {
			t.Fatal("Cancel did not shut the gate")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		g.Abandon(ctx)
		if ctx.Err() == nil {
			t.Fatal("Abandon returned before the hanging release or its deadline")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ran) != 1 || ran[0] != "kept" {
			t.Fatalf("Abandon ran %v, want only the release still registered", ran)
		}
	})
	t.Run("NothingIsRegisteredOnceOpen", func(t *testing.T) {
		g := NewGate()
		g.Hold()
		g.Open()
		ran := false
		g.OnCancel(func(context.Context) { ran = true })()
		g.Abandon(context.Background())
		if ran || g.Cancelled() {
			t.Fatalf("on an open gate: release ran %v, Cancelled %v; want neither", ran, g.Cancelled())
		}
	})
}
