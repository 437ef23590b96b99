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

	t.Run("TheDefaultPolicyIsSkip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, DispatcherConfig{})
		if got := d.RecordOptions().OnFailed; got != outboxdb.OrderSkip {
			t.Errorf("default policy %q, want skip", got)
		}
	})
}
