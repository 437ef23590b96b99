package outbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/handoff"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// fakeDispatcher stands in for the outbox_retry input of the same process:
// it grants up to room slots and keeps what it is handed.
type fakeDispatcher struct {
	mu       sync.Mutex
	room     int
	closed   bool
	reserved int
	got      []outboxdb.ClaimedRow
}

func (d *fakeDispatcher) Claim() outboxdb.DirectClaim {
	return outboxdb.DirectClaim{Lease: time.Minute, Claimer: "dispatcher-1"}
}

func (d *fakeDispatcher) Reserve(n int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := min(n, d.room)
	d.room -= g
	d.reserved += g
	return g
}

func (d *fakeDispatcher) Deliver(granted int, rows []outboxdb.ClaimedRow) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reserved -= granted
	if d.closed {
		d.room += granted
		return false
	}
	d.room += granted - len(rows)
	d.got = append(d.got, rows...)
	return true
}

func (d *fakeDispatcher) DueAt(time.Time) {}

func TestDirectDispatch(t *testing.T) {
	t.Parallel()

	t.Run("HandsOverWhatTheDispatcherHasRoomFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := &fakeDispatcher{room: 2}
		t.Cleanup(handoff.Register(b.dsn, d))
		p := b.processor(t, defaultYAML)
		if out := process(t, p,
			kmsg(topicVehicle, 0, 1, vehicle("v1")),
			kmsg(topicVehicle, 0, 2, []byte("not json")),
			kmsg(topicHeartbeat, 1, 3, heartbeat("h1")),
			kmsg(topicVehicle, 0, 4, vehicle("v2")),
		); len(out) != 0 {
			t.Fatalf("emit: none passed %d batches on", len(out))
		}
		rows := b.rows(t)
		if len(d.got) != 2 || d.reserved != 0 || d.room != 0 {
			t.Fatalf("dispatcher got %d rows (reserved %d, room %d), want 2 and no reservation left", len(d.got), d.reserved, d.room)
		}
		for _, c := range d.got {
			r := rows[c.MessageKey]
			if c.MessageKey != "v1" && c.MessageKey != "h1" {
				t.Errorf("handed over %s, want the first two deliverable messages", c.MessageKey)
			}
			if r.Status != "IN_PROGRESS" || r.AttemptCount != 1 || r.ID != c.ID || string(c.Payload) != string(r.Payload) {
				t.Errorf("row %s = %+v, handed %+v: want it claimed at attempt 1", c.MessageKey, r, c)
			}
		}
		if r := rows["v2"]; r.Status != "PENDING" {
			t.Errorf("v2 %s, want PENDING: the dispatcher had no room left", r.Status)
		}
		if r := rows["device-vehicle-event-0-2"]; r.Status != "FAILED" {
			t.Errorf("the bad message is %s, want FAILED and not handed over", r.Status)
		}
	})

	t.Run("RowsForAClosedDispatcherAreGivenBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := &fakeDispatcher{room: 10, closed: true}
		t.Cleanup(handoff.Register(b.dsn, d))
		p := b.processor(t, defaultYAML)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		for key, r := range b.rows(t) {
			if r.Status != "PENDING" || r.AttemptCount != 0 {
				t.Errorf("row %s = %s at attempt %d, want PENDING as if never claimed", key, r.Status, r.AttemptCount)
			}
		}
		if d.room != 10 || d.reserved != 0 {
			t.Errorf("room %d reserved %d, want every slot back", d.room, d.reserved)
		}
	})

	t.Run("RetryAfterALostReplyHandsOverTheCommittedClaims", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := &fakeDispatcher{room: 10}
		t.Cleanup(handoff.Register(b.dsn, d))
		p := b.processor(t, defaultYAML)
		inserts := loseFirstReply(p, nil)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		if *inserts != 2 {
			t.Fatalf("%d inserts, want the lost one and its retry", *inserts)
		}
		rows := b.rows(t)
		if len(d.got) != 2 || d.reserved != 0 || d.room != 8 {
			t.Fatalf("dispatcher got %d rows (reserved %d, room %d), want both rows and one reservation", len(d.got), d.reserved, d.room)
		}
		for _, c := range d.got {
			if r := rows[c.MessageKey]; r.Status != "IN_PROGRESS" || r.AttemptCount != 1 || r.ID != c.ID {
				t.Errorf("row %s = %+v, want it handed over at attempt 1", c.MessageKey, r)
			}
		}
		var logs int
		if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM forward_retry_logs").Scan(&logs); err != nil || logs != 0 {
			t.Errorf("%d attempt logs (%v), want none: nothing was attempted", logs, err)
		}
	})

	t.Run("ReservationIsGivenBackAndRecoveredRowsGoOverAnyway", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := &fakeDispatcher{room: 2}
		t.Cleanup(handoff.Register(b.dsn, d))
		p := b.processor(t, defaultYAML)
		loseFirstReply(p, func() {
			// The dispatcher fills up while the processor waits to retry:
			// the two slots given back on the failure are taken at once.
			d.mu.Lock()
			d.room -= 2
			d.mu.Unlock()
		})
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		if d.reserved != 0 || d.room != -2 {
			t.Errorf("reserved %d, room %d: want the failed attempt's slots given back and the retry granted none", d.reserved, d.room)
		}
		// Both were claimed by the lost attempt: handed over all the same,
		// rather than left to their lease.
		if len(d.got) != 2 {
			t.Fatalf("dispatcher got %d rows, want the 2 recovered ones", len(d.got))
		}
		for key, r := range b.rows(t) {
			if r.Status != "IN_PROGRESS" || r.AttemptCount != 1 {
				t.Errorf("row %s = %s at attempt %d, want handed over at attempt 1", key, r.Status, r.AttemptCount)
			}
		}
	})

	t.Run("OffByConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := &fakeDispatcher{room: 10}
		t.Cleanup(handoff.Register(b.dsn, d))
		p := b.processor(t, defaultYAML+"direct_dispatch: false\n")
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")))
		if r := b.rows(t)["v1"]; r.Status != "PENDING" || len(d.got) != 0 {
			t.Errorf("row %s, %d handed over: want PENDING and nothing handed over", r.Status, len(d.got))
		}
	})
}

// loseFirstReply makes p's first direct insert commit and then fail, as when
// the connection drops before the reply arrives; meanwhile (if not nil) runs
// before the failure is reported. Retries come within milliseconds. It
// returns the count of direct inserts made.
func loseFirstReply(p *outboxProcessor, meanwhile func()) *int {
	p.retryInitial, p.retryMax = time.Millisecond, 5*time.Millisecond
	inserts := new(int)
	p.afterInsertClaim = func() error {
		if *inserts++; *inserts > 1 {
			return nil
		}
		if meanwhile != nil {
			meanwhile()
		}
		return errors.New("connection reset after the commit")
	}
	return inserts
}
