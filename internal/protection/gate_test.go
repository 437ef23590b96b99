package protection

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestGateSharedByInstances runs two gates, as two instances would, on one
// database.
func TestGateSharedByInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newPair := func(t *testing.T, cfg Config) (*Gate, *Gate) {
		t.Helper()
		pool := pgtest.NewPool(t)
		cfg.SyncInterval = 50 * time.Millisecond
		cfg.MaxInFlight = 10
		// Five failures of distinct messages open it at once: the
		// silence that opening waits for is the breaker's own test.
		cfg.Breaker.Silence = time.Nanosecond
		a, b := NewGate(cfg, quietLog, Metrics{}), NewGate(cfg, quietLog, Metrics{})
		for _, g := range []*Gate{a, b} {
			if err := g.Start(ctx, pool); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Stop)
		}
		return a, b
	}

	t.Run("OneInstanceOpensItForAll", func(t *testing.T) {
		t.Parallel()
		a, b := newPair(t, Config{ProbeInterval: time.Hour})
		for i := range 5 {
			a.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "http 503"})
		}
		if a.State() != BreakerOpen || a.allow(1) != Deny {
			t.Fatalf("a: state %v, allow %v after 5 unavailable replies", a.State(), a.allow(1))
		}
		eventually(t, "the other instance follows", func() bool { return b.State() == BreakerOpen })
		if b.allow(2) != Deny {
			t.Fatal("b sends while the breaker is open")
		}
		if blocked, _, _ := b.Blocked(); !blocked {
			t.Fatal("b's dispatcher is not blocked")
		}
		if a.Limiter().Limit() != 1 {
			t.Fatalf("concurrency %d while open, want 1 to start from", a.Limiter().Limit())
		}
	})

	t.Run("OneProbePerIntervalAcrossInstances", func(t *testing.T) {
		t.Parallel()
		// A second, not less: a third probe falls in the window only if
		// start comes half an interval after the opening was written, and
		// the Reports after the opening take that long only on a machine
		// busier than any we have seen (300 ms was not enough under -race).
		const interval = time.Second
		a, b := newPair(t, Config{ProbeInterval: interval})
		for i := range 5 {
			a.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "timeout"})
		}
		// The opening is in the database once Report returns: the probe
		// times count from it, however late b follows on a busy machine.
		start := time.Now()
		eventually(t, "b follows", func() bool { return b.State() == BreakerOpen })
		var won atomic.Int64
		var wg sync.WaitGroup
		for _, g := range []*Gate{a, b} {
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Since(start) < 5*interval/2 {
						if g.TryProbe(ctx) {
							won.Add(1)
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
			}
		}
		wg.Wait()
		// 2.5 intervals from the opening: the probes at 1 and 2 intervals.
		if n := won.Load(); n != 2 {
			t.Fatalf("%d probes in 2.5 intervals by 6 callers on 2 instances, want 2", n)
		}
	})

	t.Run("AHealthyProbeHalfOpensThenHealthyRepliesClose", func(t *testing.T) {
		t.Parallel()
		a, b := newPair(t, Config{ProbeInterval: time.Millisecond, Breaker: BreakerConfig{HalfOpenMessages: 3}})
		for i := range 5 {
			a.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "refused"})
		}
		eventually(t, "b follows", func() bool { return b.State() == BreakerOpen })
		time.Sleep(5 * time.Millisecond)
		if !b.TryProbe(ctx) {
			t.Fatal("no probe for b")
		}
		b.MarkProbe(42, true)
		if b.allow(42) != Probe || b.allow(43) != Deny {
			t.Fatal("the probe row is not allowed alone")
		}
		b.report(ctx, 42, Probe, Reply{})
		if b.State() != BreakerHalfOpen || b.allow(43) != Send {
			t.Fatalf("after a healthy probe: %v", b.State())
		}
		eventually(t, "a follows to half-open", func() bool { return a.State() == BreakerHalfOpen })
		for i := range 3 {
			a.report(ctx, int64(i), Send, Reply{})
		}
		eventually(t, "closed for both", func() bool { return a.State() == BreakerClosed && b.State() == BreakerClosed })
	})

	t.Run("AProbeProvesNothingWithAMessageFailingOnItsOwn", func(t *testing.T) {
		t.Parallel()
		a, _ := newPair(t, Config{ProbeInterval: time.Hour})
		failedAt := time.Now()
		a.report(ctx, 100, Send, Reply{Sent: failedAt.Add(time.Millisecond)}) // answered after failedAt
		for i := range 5 {
			a.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "http 500"})
		}
		if a.State() != BreakerOpen {
			t.Fatalf("state %v after 5 fresh failures, want OPEN", a.State())
		}
		down := Reply{Unavailable: true, Why: "http 500"}
		for _, c := range []struct {
			name     string
			unspent  bool
			previous time.Time
			want     string
		}{
			{"NeverFailed", true, time.Time{}, "unavailable"},
			{"AttemptsSpent", false, time.Time{}, "inconclusive"},
			// Its failure did not count, but a request sent after it was
			// answered: it fails on its own.
			{"FailedWhileOthersWereAnswered", true, failedAt, "inconclusive"},
			// Nothing sent after its failure was answered: it may have
			// found the platform down.
			{"FailedAfterTheLastAnswer", true, failedAt.Add(time.Second), "unavailable"},
		} {
			r := down
			r.PreviousFailure = c.previous
			if got := a.probed(ctx, 42, r, c.unspent); got != c.want {
				t.Errorf("%s: a failed probe is %s, want %s", c.name, got, c.want)
			}
		}
		if a.State() != BreakerOpen {
			t.Fatalf("state %v after failed probes, want OPEN", a.State())
		}
		if got := a.probed(ctx, 42, Reply{PreviousFailure: failedAt}, false); got != "healthy" || a.State() != BreakerHalfOpen {
			t.Errorf("a healthy probe on a message failing on its own: %s, state %v; want it to half-open", got, a.State())
		}
	})

	t.Run("RetryAfterPausesEveryInstance", func(t *testing.T) {
		t.Parallel()
		a, b := newPair(t, Config{})
		a.report(ctx, 1, Send, Reply{Unavailable: true, Overloaded: true, PauseFor: 2 * time.Second, Why: "http 429"})
		if a.allow(2) != Deny {
			t.Fatal("a sends during its own pause")
		}
		eventually(t, "b pauses", func() bool { return b.allow(3) == Deny })
		blocked, until, _ := b.Blocked()
		if !blocked || time.Until(until) < time.Second {
			t.Fatalf("b blocked %v until %v", blocked, until)
		}
	})

	t.Run("RateTokensAreSharedByInstances", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		// Two instances ask for 5 at a time from a bucket of 10 refilled
		// at 10/s: 10 at once, then 10 more per second between them.
		var granted atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < time.Second {
					ok, wait, err := outboxdb.TakeRateTokens(ctx, pool, 5, 10, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						granted.Add(5)
						continue
					}
					time.Sleep(min(wait, 50*time.Millisecond))
				}
			}()
		}
		wg.Wait()
		if n := granted.Load(); n < 15 || n > 25 {
			t.Fatalf("%d tokens granted in 1s from a bucket of 10 at 10/s, want about 20", n)
		}
	})
}

// TestGateIgnoresAStateReadBeforeItsOwnDecision: a read of the shared state
// that began before this instance opened the breaker (or was told to pause)
// returns the state from before, and must not undo the decision; the
// breaker closed for a moment would let a row on its last attempt fail
// during the outage. Reads that began after it are followed.
func TestGateIgnoresAStateReadBeforeItsOwnDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := NewGate(Config{MaxInFlight: 10, ProbeInterval: time.Hour, Breaker: BreakerConfig{Silence: time.Nanosecond}}, quietLog, Metrics{})
	decisions := func() uint64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.decisions
	}

	before := decisions() // a sync starts reading: CLOSED
	for i := range 5 {
		g.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "http 503"})
	}
	if g.State() != BreakerOpen {
		t.Fatalf("state %v after 5 unavailable replies", g.State())
	}
	g.follow(outboxdb.PlatformState{Breaker: "CLOSED"}, time.Now(), before) // ... and returns
	if g.State() != BreakerOpen || g.allow(1) != Deny {
		t.Fatalf("a state read before the breaker opened closed it again: state %v", g.State())
	}

	// A read that begins and ends while this instance writes its decision
	// to the database sees the state before it.
	g.mu.Lock()
	g.sharing++
	g.mu.Unlock()
	g.follow(outboxdb.PlatformState{Breaker: "CLOSED"}, time.Now(), decisions())
	g.mu.Lock()
	g.sharing--
	g.mu.Unlock()
	if g.State() != BreakerOpen {
		t.Fatalf("a state read during this instance's write of its decision was followed: %v", g.State())
	}

	g.follow(outboxdb.PlatformState{Breaker: "HALF_OPEN"}, time.Now(), decisions())
	if g.State() != BreakerHalfOpen {
		t.Fatalf("a state read after the decision was not followed: %v", g.State())
	}

	// A pause asked for here is not shortened by a read that predates it,
	// nor by a later read of a shorter one.
	before = decisions()
	g.pause(ctx, time.Minute)
	g.follow(outboxdb.PlatformState{Breaker: "HALF_OPEN"}, time.Now(), before)
	g.follow(outboxdb.PlatformState{Breaker: "HALF_OPEN", PausedFor: time.Second}, time.Now(), decisions())
	if g.allow(1) != Deny {
		t.Fatal("a read of the shared state ended a pause early")
	}

	// Another instance's pause counts from when its reply arrived here.
	other := NewGate(Config{MaxInFlight: 10}, quietLog, Metrics{})
	arrived := time.Now()
	other.follow(outboxdb.PlatformState{PausedFor: time.Hour}, arrived, 0)
	other.mu.Lock()
	until := other.pausedUntil
	other.mu.Unlock()
	if !until.Equal(arrived.Add(time.Hour)) || other.allow(1) != Deny {
		t.Fatalf("paused until %v, want the reply's arrival + 1h (%v)", until, arrived.Add(time.Hour))
	}
}

// TestGateStopsRightAfterStart: a gate stopped as soon as it started (an
// output closed while connecting) ends its sync loop cleanly. The loop used
// to read the channel it closes from the gate, which Stop clears: a loop
// that began after Stop closed a nil channel and panicked.
func TestGateStopsRightAfterStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	g := NewGate(Config{MaxInFlight: 1}, quietLog, Metrics{})
	for range 50 {
		if err := g.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
		g.Stop()
	}
}

// TestGateFollowsTheOperatorsPause: two instances hold delivery while an
// operator's pause is in force (no request, not even a probe; a reply then
// spends no attempt), both let it go at a resume, which a Retry-After pause
// never does, and at the pause's end by themselves; after it, sending
// starts again from one request at a time (docs/operations.md, "Planned
// maintenance").
func TestGateFollowsTheOperatorsPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	cfg := Config{SyncInterval: 50 * time.Millisecond, MaxInFlight: 10, ProbeInterval: time.Millisecond}
	a, b := NewGate(cfg, quietLog, Metrics{}), NewGate(cfg, quietLog, Metrics{})
	for _, g := range []*Gate{a, b} {
		if err := g.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	stopA := sync.OnceFunc(a.Stop)
	t.Cleanup(stopA)
	t.Cleanup(b.Stop)
	holding := func(g *Gate) bool {
		blocked, _, _ := g.Blocked()
		return blocked && g.allow(1) == Deny
	}

	if _, err := outboxdb.PauseDelivery(ctx, pool, time.Time{}, "alice", "maintenance"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both instances hold delivery", func() bool { return holding(a) && holding(b) })
	// Not even a probe: the breaker's own state does not matter.
	a.MarkProbe(7, true)
	if p := a.allow(7); p != Deny {
		t.Errorf("a probe's row is allowed %v while paused", p)
	}
	if a.TryProbe(ctx) {
		t.Error("a probe was taken while paused")
	}
	if counted := a.report(ctx, 1, Send, Reply{Unavailable: true, Fresh: true, Why: "http 503"}); counted {
		t.Error("a failed reply while paused spent an attempt")
	}
	// The pause holds past any number of reads.
	time.Sleep(5 * cfg.SyncInterval)
	if !holding(a) || !holding(b) {
		t.Fatal("the pause ended by itself without an end")
	}

	if was, err := outboxdb.ResumeDelivery(ctx, pool, "bob"); err != nil || !was {
		t.Fatalf("resume: %v, %v", was, err)
	}
	eventually(t, "both instances send again", func() bool { return !holding(a) && !holding(b) })
	for name, g := range map[string]*Gate{"a": a, "b": b} {
		if l := g.Limiter().Limit(); l != 1 {
			t.Errorf("%s resumed with a concurrency limit of %d, want 1 (the ramp after an outage)", name, l)
		}
	}

	// A pause with an end lets go at the end, with no read after it.
	if _, err := outboxdb.PauseDelivery(ctx, pool, time.Now().Add(time.Second), "alice", "short"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the short pause holds", func() bool { return holding(a) })
	a.mu.Lock()
	end := a.hold.end
	a.mu.Unlock()
	if left := time.Until(end); left <= 0 || left > time.Second {
		t.Fatalf("the pause ends %v from now on a's clock, want within the second it was given", left)
	}
	stopA() // no more reads
	time.Sleep(time.Until(end) + 20*time.Millisecond)
	if holding(a) {
		t.Error("the pause held past its end")
	}
}

// TestGateAdmit: a request enters the gate once before it goes (Admit) and
// once after (Finish, or Drop when it was not made), and every way out gives
// its slot back.
func TestGateAdmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newGate := func() *Gate {
		return NewGate(Config{MaxInFlight: 2, ProbeInterval: time.Hour}, quietLog, Metrics{})
	}
	inFlight := func(g *Gate) int { return g.Limiter().InFlight() }
	// openWithProbe is a gate whose breaker is open and whose row 7
	// carries the probe.
	openWithProbe := func() *Gate {
		g := newGate()
		g.mu.Lock()
		g.b.set(BreakerOpen, time.Now())
		g.mu.Unlock()
		g.MarkProbe(7, true)
		return g
	}

	t.Run("FinishReportsAndGivesTheSlotBack", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		tk, err := g.Admit(ctx, 1)
		if err != nil || tk.Probe() || inFlight(g) != 1 {
			t.Fatalf("admit: %v, probe %v, in flight %d; want a send holding one slot", err, tk.Probe(), inFlight(g))
		}
		if !tk.Finish(ctx, Reply{}) || inFlight(g) != 0 {
			t.Fatalf("a healthy reply: counted false or the slot kept (in flight %d)", inFlight(g))
		}
		tk.Drop() // after Finish: nothing more
		if inFlight(g) != 0 {
			t.Fatalf("in flight %d after Finish and Drop", inFlight(g))
		}
	})
	t.Run("PausedIsDeniedWithoutHoldingASlot", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		g.pause(ctx, time.Hour)
		if _, err := g.Admit(ctx, 1); !errors.Is(err, ErrDenied) || inFlight(g) != 0 {
			t.Fatalf("admit while paused: %v, in flight %d; want ErrDenied and no slot", err, inFlight(g))
		}
	})
	t.Run("DropForgetsTheProbeMark", func(t *testing.T) {
		t.Parallel()
		g := openWithProbe()
		tk, err := g.Admit(ctx, 7)
		if err != nil || !tk.Probe() {
			t.Fatalf("admit of the marked row: %v; want the probe", err)
		}
		tk.Drop()
		if _, err := g.Admit(ctx, 7); !errors.Is(err, ErrDenied) || inFlight(g) != 0 {
			t.Fatalf("the row again after Drop: %v, in flight %d; want ErrDenied (no probe mark left)", err, inFlight(g))
		}
	})
	t.Run("StoppingForgetsTheProbeMark", func(t *testing.T) {
		t.Parallel()
		g := openWithProbe()
		done, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := g.Admit(done, 7); !errors.Is(err, context.Canceled) {
			t.Fatalf("admit after the context ended: %v", err)
		}
		if _, err := g.Admit(ctx, 7); !errors.Is(err, ErrDenied) {
			t.Fatalf("the row after a stopped admit: %v; want ErrDenied (no probe mark left)", err)
		}
	})
}

// TestGatePausedDuringAnOutage: an operator's pause taken while the breaker
// is open stops the probes too, and resuming it does not close the breaker:
// only probes go again, as before the pause, until one succeeds.
func TestGatePausedDuringAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	g := NewGate(Config{SyncInterval: 50 * time.Millisecond, MaxInFlight: 10, ProbeInterval: 100 * time.Millisecond,
		Breaker: BreakerConfig{Silence: time.Nanosecond}}, quietLog, Metrics{})
	if err := g.Start(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	held := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.held
	}

	for i := range 5 {
		g.report(ctx, int64(i), Send, Reply{Unavailable: true, Fresh: true, Why: "http 503"})
	}
	if g.State() != BreakerOpen {
		t.Fatalf("breaker %v after 5 distinct failures, want OPEN", g.State())
	}
	if _, err := outboxdb.PauseDelivery(ctx, pool, time.Time{}, "alice", "the platform's maintenance"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gate holds", held)
	time.Sleep(3 * g.cfg.ProbeInterval) // probes would be due
	if g.TryProbe(ctx) {
		t.Error("a probe was taken while paused during an outage")
	}

	if _, err := outboxdb.ResumeDelivery(ctx, pool, "bob"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gate lets go", func() bool { return !held() })
	if s := g.State(); s != BreakerOpen {
		t.Errorf("breaker %v after the resume, want still OPEN: nothing has shown the platform up", s)
	}
	if p := g.allow(100); p != Deny {
		t.Errorf("a request was allowed (%v) after the resume while the breaker is open", p)
	}
	if l := g.Limiter().Limit(); l != 1 {
		t.Errorf("concurrency limit %d after the resume during an outage, want 1", l)
	}
	eventually(t, "probes go again", func() bool { return g.TryProbe(ctx) })
}

// eventually fails t unless ok holds within 5 s.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGateAnnouncesHealthyReplies: a gate tells the other instances on the
// notification channel when it last had a healthy reply, once per read of
// the shared state and only when it had one since it last said so; its
// breaker ignores its own announcement.
func TestGateAnnouncesHealthyReplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	conn := pgtest.Listen(t, pool, outboxdb.NotifyChannel)
	const sync = 50 * time.Millisecond
	g := NewGate(Config{MaxInFlight: 10, SyncInterval: sync, Instance: "pod-1"}, quietLog, Metrics{})
	if err := g.Start(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	// notices reads the healthy replies announced within d.
	notices := func(d time.Duration) (got []string) {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		for {
			n, err := conn.WaitForNotification(wctx)
			if err != nil {
				return got
			}
			if instance, ago, ok := outboxdb.HealthyNotice(n.Payload); ok {
				if instance != "pod-1" || ago < 0 || ago > time.Second {
					t.Errorf("announced %q: want pod-1's reply of moments ago", n.Payload)
				}
				got = append(got, n.Payload)
			}
		}
	}
	if got := notices(5 * sync); len(got) != 0 {
		t.Fatalf("announced %v before any reply", got)
	}
	g.report(ctx, 1, Send, Reply{Unavailable: true, Fresh: true, Why: "http 503"})
	if got := notices(5 * sync); len(got) != 0 {
		t.Fatalf("announced %v after an unavailable reply only", got)
	}
	for id := range int64(20) {
		g.report(ctx, 100+id, Send, Reply{})
	}
	// Once, or twice should a read of the shared state fall within the
	// burst: not once per reply.
	if got := notices(5 * sync); len(got) < 1 || len(got) > 2 {
		t.Fatalf("announced %v after a burst of 20 healthy replies, want it once", got)
	}
	if got := notices(5 * sync); len(got) != 0 {
		t.Fatalf("announced %v again with no reply since", got)
	}
	// Its own announcement is not another instance's reply.
	peerHealthy := func() time.Time {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.b.peerHealthy
	}
	before := peerHealthy()
	g.FollowPeerHealthy("pod-1", 0)
	if got := peerHealthy(); !got.Equal(before) {
		t.Fatalf("its own announcement was taken as another instance's reply (at %v)", got)
	}
	g.FollowPeerHealthy("pod-2", 0)
	if !peerHealthy().After(before) {
		t.Fatal("another instance's announcement was not taken")
	}
}
