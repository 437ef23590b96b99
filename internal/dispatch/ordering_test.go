package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// enterSent is a berth's enter and exit, the exit held behind the enter,
// and a dispatcher "me" that has claimed the enter (rows).
func enterSent(t *testing.T, hooks ...func(*Dispatcher)) (b *testBundle, d *Dispatcher, ids []int64, rows []outboxdb.Record) {
	t.Helper()
	b = setup(t)
	ids = b.db.Insert(
		fixture.Row{Key: "enter", OrderingKey: "P1/B1"},
		fixture.Row{Key: "exit", OrderingKey: "P1/B1", OrderHeld: true},
	)
	d = b.dispatcher(t, DispatcherConfig{Claimer: "me"}, hooks...)
	rows = b.next(t, d)
	if len(rows) != 1 || rows[0].ID != ids[0] {
		t.Fatalf("handed out %+v, want the enter", rows)
	}
	return b, d, ids, rows
}

func TestOrdering(t *testing.T) {
	t.Parallel()

	t.Run("ExhaustedHeadsFollowTheDispatchersPolicy", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.db.Insert(
			fixture.Row{Key: "enter", OrderingKey: "P1/B1", Attempts: 2},
			fixture.Row{Key: "exit", OrderingKey: "P1/B1", OrderHeld: true},
		)
		d := b.dispatcher(t, DispatcherConfig{MaxAttempts: 2, OrderOnFailed: outboxdb.OrderBlock, PollInterval: 50 * time.Millisecond})
		// Next claims the head, finds it out of attempts and fails it; with
		// nothing to hand out it waits until its context ends.
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		defer cancel()
		if rows, err := d.Next(ctx); len(rows) != 0 {
			t.Fatalf("handed out %+v (%v), want nothing", rows, err)
		}
		if s := b.db.State(ids[0]); s.Status != "FAILED" {
			t.Fatalf("the exhausted head is %s, want FAILED", s.Status)
		}
		if s := b.db.State(ids[0]); !s.OrderBlocked {
			t.Errorf("the exhausted head does not block its key under order_on_failed block: %+v", s)
		}
		if s := b.db.State(ids[1]); !s.OrderHeld {
			t.Error("the row behind a blocked head was released")
		}
		if got := d.RecordOptions().OnFailed; got != outboxdb.OrderBlock {
			t.Errorf("RecordOptions says %q, want block", got)
		}
	})

	t.Run("RepairReleasesStrandedRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, DispatcherConfig{})
		ids := b.db.Insert(fixture.Row{Key: "stranded", OrderingKey: "P1/B1", OrderHeld: true})
		got, err := d.orderRepairOnce(b.ctx, d.Pool())
		if err != nil || len(got) != 1 || got[0].ID != ids[0] {
			t.Fatalf("repaired %+v (%v), want row %d", got, err, ids[0])
		}
		if rows := b.next(t, d); len(rows) != 1 || rows[0].ID != ids[0] {
			t.Errorf("the repaired row was not dispatched: %+v", rows)
		}
		if got, err := d.orderRepairOnce(b.ctx, d.Pool()); err != nil || len(got) != 0 {
			t.Errorf("a second repair found %+v (%v)", got, err)
		}
	})

	t.Run("ReleasedRowsAreHandedOverClaimed", func(t *testing.T) {
		t.Parallel()
		b, d, ids, rows := enterSent(t)
		claims := 0
		d.OnClaim = func() { claims++ }
		recorded, err := RecordResults(b.ctx, d.Pool(), d, []outboxdb.Result{{ID: rows[0].ID, ClaimToken: rows[0].ClaimToken, Status: outboxdb.StatusSuccess}})
		if err != nil || len(recorded) != 1 {
			t.Fatalf("recorded %v (%v)", recorded, err)
		}
		d.Done(b.ctx, []outboxdb.ClaimRef{rows[0].Ref()}, nil)
		next := b.next(t, d)
		if len(next) != 1 || next[0].ID != ids[1] || claims != 0 {
			t.Fatalf("handed out %+v after %d claims, want the exit handed over without a claim", next, claims)
		}
		if s := b.db.State(ids[1]); s.Status != "IN_PROGRESS" || fixture.Str(s.ClaimedBy) != "me" || s.AttemptCount != 1 {
			t.Errorf("the exit is %+v, want claimed for this dispatcher", s)
		}
		if held := d.Ledger().Held(); held != 1 {
			t.Errorf("the ledger holds %d rows, want the exit", held)
		}
	})

	// Another instance's dispatcher finds nothing due and says so; this
	// one, finishing a berth's event, then leaves the next one due instead
	// of claiming it for itself, and the idle one takes it. A dispatcher's
	// own notice does not stop its chains.
	t.Run("ReleasedRowsGoDueWhileAnotherInstanceIsIdle", func(t *testing.T) {
		t.Parallel()
		listening, heard := make(chan struct{}, 1), make(chan string, 1)
		b, d, ids, rows := enterSent(t, func(d *Dispatcher) {
			d.OnListen = func() {
				select {
				case listening <- struct{}{}:
				default:
				}
			}
			d.OnIdleNotice = func(c string) {
				select {
				case heard <- c:
				default: // the other instance's later notices
				}
			}
		})
		select {
		case <-listening:
		case <-time.After(10 * time.Second):
			t.Fatal("the dispatcher never listened for notifications")
		}
		if err := outboxdb.AnnounceIdle(b.ctx, d.Pool(), "me"); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-heard:
			if c != "me" {
				t.Fatalf("heard an idle notice from %q, want its own", c)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the listener never delivered its own idle notice")
		}
		if g := d.Ledger().ReserveChain(1, time.Now()); g.Rows != 1 {
			t.Fatalf("its own idle notice stopped chains (granted %d)", g.Rows)
		} else {
			d.Ledger().Deliver(g, nil)
		}
		// Another instance's dispatcher looks for due rows and finds none;
		// it would poll again in a minute, so only a notification wakes it.
		hub, err := NewHub(b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		idle, err := NewDispatcher(hub, DispatcherConfig{Claimer: "another", PollInterval: time.Minute}, quietLog, DispatcherMetrics{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = idle.Close(context.Background()) })
		if err := idle.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		taken := make(chan []outboxdb.Record, 1)
		go func() {
			rows, _ := idle.Next(ctx)
			taken <- rows
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			g := d.Ledger().ReserveChain(1, time.Now())
			d.Ledger().Deliver(g, nil)
			if g.Rows == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the other instance's idle notice did not stop chains")
			}
		}
		if _, err := RecordResults(b.ctx, d.Pool(), d, []outboxdb.Result{{ID: rows[0].ID, ClaimToken: rows[0].ClaimToken, Status: outboxdb.StatusSuccess}}); err != nil {
			t.Fatal(err)
		}
		if next := d.Ledger().Queued(); next != 0 {
			t.Errorf("%d rows handed to this dispatcher, want the exit released due", next)
		}
		// Due, it goes to the idle one, woken by the release's notice.
		if got := <-taken; len(got) != 1 || got[0].ID != ids[1] {
			t.Fatalf("the idle dispatcher took %+v, want the exit", got)
		}
		if s := b.db.State(ids[1]); s.Status != "IN_PROGRESS" || fixture.Str(s.ClaimedBy) != "another" {
			t.Errorf("the exit is %+v, want claimed by the idle dispatcher", s)
		}
	})

	t.Run("TheDefaultPolicyIsSkip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, DispatcherConfig{})
		if got := d.RecordOptions().OnFailed; got != outboxdb.OrderSkip {
			t.Errorf("default policy %q, want skip", got)
		}
	})
}

// TestLedgerChainsWaitWhileAPeerIsIdle: while another dispatcher says it
// found nothing to claim, no chained reservation is granted (the released
// rows go due, for any instance); after, they are again. A notice that ends
// sooner does not cut a longer one short.
func TestLedgerChainsWaitWhileAPeerIsIdle(t *testing.T) {
	t.Parallel()
	l := NewLedger(Limits{Rows: 10})
	t0 := time.Now()
	l.PeerIdle(t0.Add(3 * time.Second))
	l.PeerIdle(t0.Add(time.Second))
	if g := l.ReserveChain(2, t0.Add(2*time.Second)); g.Rows != 0 {
		t.Errorf("granted %d chained rows while a peer is idle, want 0", g.Rows)
	}
	g := l.ReserveChain(2, t0.Add(3*time.Second))
	if g.Rows != 2 {
		t.Errorf("granted %d chained rows once the peer's notice ran out, want 2", g.Rows)
	}
	l.Deliver(g, nil)
}

// TestLedgerReserveChain: a chained reservation is granted beyond the room
// left (each row replaces one the same write finishes), even while the
// dispatcher waits for room, but not once closed.
func TestLedgerReserveChain(t *testing.T) {
	t.Parallel()
	l := NewLedger(Limits{Rows: 2})
	l.Hold([]outboxdb.Record{row(1, 10), row(2, 10)}, time.Time{})
	g := l.ReserveChain(2, time.Now())
	if g.Rows != 2 {
		t.Fatalf("granted %d with a full ledger, want 2", g.Rows)
	}
	l.Deliver(g, []outboxdb.Record{row(3, 10)})
	if l.Held() != 3 || l.Queued() != 1 {
		t.Fatalf("held %d, queued %d after delivering one chained row", l.Held(), l.Queued())
	}
	l.Settle([]outboxdb.ClaimRef{row(1, 10).Ref(), row(2, 10).Ref()})
	if rows, _ := l.Room(); rows != 1 {
		t.Errorf("room %d once the finished rows left, want 1", rows)
	}
	l.SetWaitForRoom(true)
	g = l.ReserveChain(1, time.Now())
	if g.Rows != 1 {
		t.Errorf("granted %d while the dispatcher waits for room, want 1", g.Rows)
	}
	l.Deliver(g, nil)
	l.Close()
	if g := l.ReserveChain(5, time.Now()); g.Rows != 0 {
		t.Errorf("granted %d once closed", g.Rows)
	}
}
