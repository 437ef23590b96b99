package dispatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	ctx context.Context
	dsn string
	db  *fixture.DB
	hub *Hub
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	hub, err := NewHub(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: context.Background(), dsn: dsn, db: fixture.New(t, pool), hub: hub}
}

var quietLog = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(io.Discard, nil)))

// dispatcher builds and connects a dispatcher on the bundle's hub, closed at
// the end of the test.
// dispatcher connects a dispatcher with cfg, its test hooks set by hooks.
func (b *testBundle) dispatcher(t *testing.T, cfg DispatcherConfig, hooks ...func(*Dispatcher)) *Dispatcher {
	t.Helper()
	d, err := NewDispatcher(b.hub, cfg, quietLog, DispatcherMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h(d)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	if err := d.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

func (b *testBundle) next(t *testing.T, d *Dispatcher) []outboxdb.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	rows, err := d.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return rows
}

// listeningDispatcher is a connected dispatcher, and a wait until it
// listens for notifications (to be called once something that reacts to
// them is attached).
func (b *testBundle) listeningDispatcher(t *testing.T) (*Dispatcher, func()) {
	t.Helper()
	d, err := NewDispatcher(b.hub, DispatcherConfig{}, quietLog, DispatcherMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{}, 1)
	d.OnListen = func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	if err := d.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	return d, func() {
		t.Helper()
		select {
		case <-listening:
		case <-time.After(10 * time.Second):
			t.Fatal("the dispatcher did not listen within 10s")
		}
	}
}

func TestDispatcher(t *testing.T) {
	t.Parallel()

	t.Run("ClaimRacingShutdownIsUndone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.db.InsertDue("r", 5)
		d := b.dispatcher(t, DispatcherConfig{})
		res, err := d.claim(b.ctx, d.Pool(), outboxdb.ClaimParams{Limit: 5})
		if err != nil || len(res.Claimed) != 5 {
			t.Fatalf("claim: %d rows, %v", len(res.Claimed), err)
		}
		ctx, cancel := context.WithCancel(b.ctx)
		cancel() // shutdown began while the claim ran
		if _, err := d.handOut(ctx, d.Pool(), res.Claimed); !errors.Is(err, context.Canceled) {
			t.Fatalf("hand-out after shutdown: %v, want context.Canceled", err)
		}
		for _, id := range ids {
			if s := b.db.State(id); s.Status != "PENDING" || s.AttemptCount != 0 || *s.DueInMs > 0 {
				t.Fatalf("row %d: %+v, want PENDING and due at attempt 0: it was never sent", id, s)
			}
		}
		if n := d.Ledger().Held(); n != 0 {
			t.Fatalf("%d rows still held", n)
		}
	})

	t.Run("AnAcknowledgedRowWithoutAResultFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.InsertDue("d", 2)
		d := b.dispatcher(t, DispatcherConfig{})
		if err := b.hub.AttachOutput(Output{Timeout: time.Second}); err != nil {
			t.Fatal(err)
		}
		rows := b.next(t, d)
		if len(rows) != 2 {
			t.Fatalf("claimed %d rows, want 2", len(rows))
		}
		// The output records the first; the pipeline dropped the second.
		sent := outboxdb.Result{ID: rows[0].ID, ClaimToken: rows[0].ClaimToken, Status: outboxdb.StatusSuccess, Sent: true}
		if _, err := RecordResults(b.ctx, d.Pool(), d, []outboxdb.Result{sent}); err != nil {
			t.Fatal(err)
		}
		if err := d.Done(b.ctx, []outboxdb.ClaimRef{rows[0].Ref(), rows[1].Ref()}, nil); err != nil {
			t.Fatal(err)
		}
		if s := b.db.State(rows[0].ID); s.Status != "SUCCESS" {
			t.Fatalf("the recorded row is %s, want SUCCESS", s.Status)
		}
		s := b.db.State(rows[1].ID)
		if s.Status != "FAILED" || fixture.Str(s.FailureClass) != "INVALID" || fixture.Str(s.LastError) != droppedReason || s.AttemptCount != 1 {
			t.Fatalf("the dropped row: %+v (last_error %q); want FAILED INVALID at attempt 1, never to come back", s, fixture.Str(s.LastError))
		}
		if logs := b.db.Logs(rows[1].ID); len(logs) != 1 || logs[0].Status != "FAILED" {
			t.Fatalf("attempt log %+v, want the one FAILED attempt", logs)
		}
		if n := d.Ledger().Held(); n != 0 {
			t.Fatalf("%d rows still held", n)
		}
	})

	t.Run("WithoutAnOutputAnAcknowledgedRowWaitsForItsLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.InsertDue("w", 1)
		d := b.dispatcher(t, DispatcherConfig{})
		rows := b.next(t, d)
		if err := d.Done(b.ctx, []outboxdb.ClaimRef{rows[0].Ref()}, nil); err != nil {
			t.Fatal(err)
		}
		if s := b.db.State(rows[0].ID); s.Status != "IN_PROGRESS" {
			t.Fatalf("row %+v, want IN_PROGRESS: nothing in the stream writes results, so its output may have taken it", s)
		}
	})

	t.Run("NoClaimBeforeTheProcessHasStarted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.db.InsertDue("s", 1)
		d, err := NewDispatcher(b.hub, DispatcherConfig{}, quietLog, DispatcherMetrics{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close(context.Background()) })
		d.started = launch.NewGate()
		d.started.Hold()
		var claims atomic.Int32
		d.OnClaim = func() { claims.Add(1) }
		if err := d.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 0 {
			t.Fatalf("Reserve before the start granted %+v; want nothing, so that the insert claims nothing", g)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		defer cancel()
		if rows, err := d.Next(ctx); !errors.Is(err, context.DeadlineExceeded) || claims.Load() != 0 {
			t.Fatalf("Next before the start: %d rows, %v, %d claim statements; want none", len(rows), err, claims.Load())
		}
		if s := b.db.State(ids[0]); s.Status != "PENDING" || s.AttemptCount != 0 {
			t.Fatalf("row %+v, want PENDING with its attempts unspent", s)
		}
		d.started.Open()
		if rows := b.next(t, d); len(rows) != 1 || rows[0].ID != ids[0] {
			t.Fatalf("after the start: %+v, want row %d", rows, ids[0])
		}
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 1 {
			t.Fatalf("Reserve after the start granted %+v; want the row", g)
		} else {
			d.Deliver(g, nil)
		}
	})

	// Ingest persists while the dispatcher still waits for its database
	// (its wait backs off further): rows claimed for it then were held with
	// no renewal running, their leases ran out, and Next claimed and sent
	// them again (test/e2e TestReadOnlyDatabaseIsWaitedFor).
	t.Run("NoDirectClaimBeforeConnect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d, err := NewDispatcher(b.hub, DispatcherConfig{}, quietLog, DispatcherMetrics{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close(context.Background()) })
		d.started = launch.NewGate()
		d.started.Open()
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 0 {
			t.Fatalf("Reserve before Connect granted %+v; want nothing, so that the insert claims nothing", g)
		}
		if err := d.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 1 {
			t.Fatalf("Reserve once connected granted %+v; want the row", g)
		} else {
			d.Deliver(g, nil)
		}
	})

	t.Run("NoDirectClaimWhileRenewalsAreLate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A lease of an hour: the renew loop (every eighth of it) does not
		// run during the test, so renewOK is what the test sets.
		d := b.dispatcher(t, DispatcherConfig{Lease: time.Hour})
		d.started = launch.NewGate()
		d.started.Open()
		setRenewOK := func(at time.Time) {
			d.mu.Lock()
			d.renewOK = at
			d.mu.Unlock()
		}
		setRenewOK(time.Now().Add(-31 * time.Minute))
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 0 {
			t.Fatalf("Reserve with the last renewal more than half a lease ago granted %+v; want nothing, so that no lease is taken that renewals may not keep", g)
		}
		setRenewOK(time.Now())
		if g := d.ReserveWithin(context.Background(), []int{10}, 0); g.Rows != 1 {
			t.Fatalf("Reserve with renewals on time granted %+v; want the row", g)
		} else {
			d.Deliver(g, nil)
		}
	})

	t.Run("ClaimsWaitWhileTheAttachedOutputsProtectionBlocks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.db.InsertDue("g", 1)
		d := b.dispatcher(t, DispatcherConfig{})
		setBreaker := func(from, to string) {
			t.Helper()
			if _, err := outboxdb.SetBreaker(b.ctx, d.Pool(), []string{from}, to, "test", "test", time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		setBreaker("CLOSED", "OPEN")
		g := protection.NewGate(protection.Config{MaxInFlight: 1, ProbeInterval: time.Hour, SyncInterval: 50 * time.Millisecond}, quietLog, protection.Metrics{})
		if err := g.Start(b.ctx, d.Pool()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		if g.State() != protection.BreakerOpen {
			t.Fatalf("gate %v, want it to follow the shared OPEN", g.State())
		}
		if err := b.hub.AttachOutput(Output{Timeout: time.Second, Protection: g}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 500*time.Millisecond)
		defer cancel()
		if rows, err := d.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next with the breaker open: %d rows, %v; want none claimed", len(rows), err)
		}
		if s := b.db.State(ids[0]); s.Status != "PENDING" || s.AttemptCount != 0 {
			t.Fatalf("row %+v, want PENDING with its attempts unspent", s)
		}
		setBreaker("OPEN", "CLOSED")
		if rows := b.next(t, d); len(rows) != 1 || rows[0].ID != ids[0] {
			t.Fatalf("after the breaker closed: %+v, want row %d", rows, ids[0])
		}
	})

	t.Run("APauseSharedByAnotherInstanceHoldsAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d, listening := b.listeningDispatcher(t)
		// The gate reads the shared state when it starts and then hourly:
		// only the database's announcement can tell it of the pause in time.
		g := protection.NewGate(protection.Config{MaxInFlight: 1, ProbeInterval: time.Hour, SyncInterval: time.Hour}, quietLog, protection.Metrics{})
		if err := g.Start(b.ctx, d.Pool()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		if err := b.hub.AttachOutput(Output{Timeout: time.Second, Protection: g}); err != nil {
			t.Fatal(err)
		}
		listening()
		if blocked, _, _ := g.Blocked(); blocked {
			t.Fatal("the gate holds before any pause")
		}
		const pause = 30 * time.Second
		asked := time.Now()
		if _, err := outboxdb.PausePlatform(b.ctx, d.Pool(), pause); err != nil {
			t.Fatal(err)
		}
		for {
			blocked, until, _ := g.Blocked()
			if blocked {
				if until.Before(asked.Add(pause)) {
					t.Errorf("held until %v after the pause was shared, want at least %v", until.Sub(asked), pause)
				}
				break
			}
			if time.Since(asked) > 10*time.Second {
				t.Fatalf("the gate does not hold %v after another instance shared a %v pause", time.Since(asked), pause)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("ThePlatformAnsweringAnotherInstanceKeepsTheBreakerClosed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d, listening := b.listeningDispatcher(t)
		// Instance a's own replies are all failures of distinct messages,
		// a silence three times the breaker's, while instance b's requests
		// are answered (with three instances at the end of a burst, one
		// may send nothing but messages the platform fails).
		breaker := protection.BreakerConfig{Messages: 5, Silence: 2 * time.Second}
		newGate := func(instance string) *protection.Gate {
			g := protection.NewGate(protection.Config{MaxInFlight: 10, ProbeInterval: time.Hour, SyncInterval: 50 * time.Millisecond,
				Breaker: breaker, Instance: instance}, quietLog, protection.Metrics{})
			if err := g.Start(b.ctx, d.Pool()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Stop)
			return g
		}
		a, other := newGate("a"), newGate("b")
		if err := b.hub.AttachOutput(Output{Timeout: time.Second, Protection: a}); err != nil {
			t.Fatal(err)
		}
		listening()
		reply := func(g *protection.Gate, id int64, unavailable bool) {
			t.Helper()
			ticket, err := g.Admit(b.ctx, id)
			if err != nil {
				t.Fatalf("admitting row %d: %v", id, err)
			}
			ticket.Finish(b.ctx, protection.Reply{Unavailable: unavailable, Fresh: true, Why: "http 500"})
		}
		answering := make(chan struct{})
		answered := make(chan struct{})
		go func() {
			defer close(answered)
			for id := int64(1_000_000); ; id++ {
				select {
				case <-answering:
					return
				case <-time.After(20 * time.Millisecond):
					if ticket, err := other.Admit(b.ctx, id); err == nil {
						ticket.Finish(b.ctx, protection.Reply{Fresh: true})
					}
				}
			}
		}()
		id := int64(1)
		for start := time.Now(); time.Since(start) < 3*breaker.Silence; id++ {
			time.Sleep(breaker.Silence / 40)
			reply(a, id, true)
			if a.State() != protection.BreakerClosed {
				close(answering)
				<-answered
				t.Fatalf("a opened the breaker after %v of its own failures (%d messages) while b's requests were answered", time.Since(start), id)
			}
		}
		// Once no instance is answered, a judges the platform as before.
		close(answering)
		<-answered
		time.Sleep(breaker.Silence + 200*time.Millisecond)
		// (Fewer may do: a's last failures before b stopped count.)
		for i := 0; i < breaker.Messages && a.State() == protection.BreakerClosed; i++ {
			reply(a, id+int64(i), true)
		}
		if a.State() != protection.BreakerOpen {
			t.Fatalf("a: %v after %d failures of distinct messages and %v with no instance answered; want it open", a.State(), breaker.Messages, breaker.Silence)
		}
	})

	t.Run("ExhaustedRowsEndFailedAndAreNotHandedOut", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.db.InsertDue("x", 2)
		b.db.Exec(`UPDATE forward_deliveries SET attempt_count = 3 WHERE id = $1`, ids[0])
		d := b.dispatcher(t, DispatcherConfig{MaxAttempts: 3})
		rows := b.next(t, d)
		if len(rows) != 1 || rows[0].ID != ids[1] {
			t.Fatalf("handed out %+v, want only row %d", rows, ids[1])
		}
		s := b.db.State(ids[0])
		if s.Status != "FAILED" || fixture.Str(s.FailureClass) != "TRANSIENT" || s.AttemptCount != 3 {
			t.Fatalf("exhausted row %+v, want FAILED (TRANSIENT) at 3 attempts", s)
		}
	})

	t.Run("LeasesOfHeldRowsAreRenewed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.InsertDue("l", 4)
		d := b.dispatcher(t, DispatcherConfig{Lease: 2 * time.Second})
		rows := b.next(t, d)
		if len(rows) != 4 {
			t.Fatalf("claimed %d rows", len(rows))
		}
		// Another instance took row 1 after its lease ran out, unseen.
		b.db.Exec(`UPDATE forward_deliveries SET claim_token = gen_random_uuid(), claimed_by = 'other' WHERE id = $1`, rows[0].ID)
		// This instance's output wrote row 4's result, and its
		// acknowledgement has not reached the dispatcher yet: settled, not
		// lost.
		if _, err := outboxdb.RecordResults(b.ctx, b.db.Pool, []outboxdb.Result{{ID: rows[3].ID, ClaimToken: rows[3].ClaimToken, Status: outboxdb.StatusSuccess, Sent: true}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		// Held three leases long: without renewals every claim would have
		// run out twice.
		deadline := time.Now().Add(6 * time.Second)
		for time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			for _, r := range rows[1:3] {
				if s := b.db.State(r.ID); s.Status != "IN_PROGRESS" || *s.DueInMs <= 0 || *s.ClaimToken != r.ClaimToken {
					t.Fatalf("held row %d lost its lease: %+v", r.ID, s)
				}
			}
		}
		if st, _, _ := d.LeaseFor(rows[0].Ref()); st != LeaseLost {
			t.Errorf("the stolen claim is reported %d, want LeaseLost", st)
		}
		if st, _, _ := d.LeaseFor(rows[3].Ref()); st == LeaseLost {
			t.Error("a claim whose result this instance wrote is reported lost")
		}
		st, deadlineHeld, renewing := d.LeaseFor(rows[1].Ref())
		if st != LeaseHeld || !renewing || time.Until(deadlineHeld) <= 0 {
			t.Errorf("a held claim: state %d renewing %v deadline in %v", st, renewing, time.Until(deadlineHeld))
		}
		if st, _, _ := d.LeaseFor(outboxdb.ClaimRef{ID: 999999, ClaimToken: "x"}); st != LeaseUnknown {
			t.Errorf("a claim never held is reported %d, want LeaseUnknown", st)
		}
	})

	t.Run("HeldRowsAreBoundedByBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		big := make([]byte, 1000)
		for i := range big {
			big[i] = 'x'
		}
		payload := append(append([]byte(`{"p":"`), big...), '"', '}')
		rows := make([]fixture.Row, 5)
		for i := range rows {
			rows[i] = fixture.Row{Key: string(rune('a' + i)), Payload: payload}
		}
		b.db.Insert(rows...)
		d := b.dispatcher(t, DispatcherConfig{MaxUnackedBytes: 2500})
		got := b.next(t, d)
		if len(got) != 2 {
			t.Fatalf("first read took %d rows of %d bytes with a 2500-byte budget, want 2", len(got), len(payload))
		}
		if _, bytes := d.Ledger().Room(); bytes >= int64(len(payload)) {
			t.Fatalf("byte room %d after the claim", bytes)
		}
		got2 := b.next(t, d)
		if len(got2) != 1 {
			t.Fatalf("second read took %d rows, want the one that still fits", len(got2))
		}
		refs := []outboxdb.ClaimRef{got[0].Ref(), got[1].Ref(), got2[0].Ref()}
		if err := d.Done(b.ctx, refs, nil); err != nil {
			t.Fatal(err)
		}
		if n := d.Ledger().Held(); n != 0 {
			t.Fatalf("%d rows held after the ack", n)
		}
	})
}

func TestHubsBelongToTheirStream(t *testing.T) {
	t.Parallel()
	a, b := service.MockResources(), service.MockResources()
	const db1 = "postgres://u@host:5432/one"
	h1, _ := HubFor(a, db1)
	same, _ := HubFor(a, "host=host port=5432 dbname=one user=u")
	if h1 != same {
		t.Fatal("two spellings of one database in one stream got two hubs")
	}
	if other, _ := HubFor(b, db1); other == h1 {
		t.Fatal("two streams share a hub")
	}
	if two, _ := HubFor(a, "postgres://u@host:5432/two"); two == h1 {
		t.Fatal("two databases share a hub")
	}
	if _, err := HubFor(a, "postgres://u:s3cret@host:notaport/db"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("bad DSN: %v", err)
	}
}
