package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

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
		b := setup(t)
		ids := b.db.Insert(
			fixture.Row{Key: "enter", OrderingKey: "P1/B1"},
			fixture.Row{Key: "exit", OrderingKey: "P1/B1", OrderHeld: true},
		)
		d := b.dispatcher(t, DispatcherConfig{Claimer: "me"})
		rows := b.next(t, d)
		if len(rows) != 1 || rows[0].ID != ids[0] {
			t.Fatalf("handed out %+v, want the enter", rows)
		}
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

	t.Run("TheDefaultPolicyIsSkip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, DispatcherConfig{})
		if got := d.RecordOptions().OnFailed; got != outboxdb.OrderSkip {
			t.Errorf("default policy %q, want skip", got)
		}
	})
}

// TestLedgerReserveChain: a chained reservation is granted beyond the room
// left (each row replaces one the same write finishes), even while the
// dispatcher waits for room, but not once closed.
func TestLedgerReserveChain(t *testing.T) {
	t.Parallel()
	l := NewLedger(Limits{Rows: 2})
	l.Hold([]outboxdb.Record{row(1, 10), row(2, 10)}, time.Time{})
	g := l.ReserveChain(2)
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
	g = l.ReserveChain(1)
	if g.Rows != 1 {
		t.Errorf("granted %d while the dispatcher waits for room, want 1", g.Rows)
	}
	l.Deliver(g, nil)
	l.Close()
	if g := l.ReserveChain(5); g.Rows != 0 {
		t.Errorf("granted %d once closed", g.Rows)
	}
}
