package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// dispatcher registers a dispatcher (the outbox_retry input's engine) in
// the bundle's stream with room for room rows, connected (a dispatcher
// grants no room before); closed says it has closed already. Nothing reads
// from it: the processor only reserves room and delivers rows to it.
func (b *testBundle) dispatcher(t *testing.T, room int, closed bool) *dispatch.Dispatcher {
	t.Helper()
	hub, err := dispatch.HubFor(b.res, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatch.NewDispatcher(hub, dispatch.DispatcherConfig{MaxUnacked: room, Lease: time.Minute, Claimer: "dispatcher-1"},
		b.res.Logger(), dispatch.DispatcherMetrics{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	if err := d.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if closed {
		if err := d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// handed takes every row delivered to d.
func handed(d *dispatch.Dispatcher) []outboxdb.Record { return d.Ledger().Take(1 << 20) }

func room(d *dispatch.Dispatcher) int {
	rows, _ := d.Ledger().Room()
	return rows
}

func TestDirectDispatch(t *testing.T) {
	t.Parallel()

	t.Run("HandsOverWhatTheDispatcherHasRoomFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, 2, false)
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
		got := handed(d)
		if len(got) != 2 || d.Ledger().Held() != 2 || room(d) != 0 {
			t.Fatalf("dispatcher got %d rows (holds %d, room %d), want 2 and no reservation left", len(got), d.Ledger().Held(), room(d))
		}
		for _, c := range got {
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
		d := b.dispatcher(t, 10, true)
		p := b.processor(t, defaultYAML)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		for key, r := range b.rows(t) {
			if r.Status != "PENDING" || r.AttemptCount != 0 {
				t.Errorf("row %s = %s at attempt %d, want PENDING as if never claimed", key, r.Status, r.AttemptCount)
			}
		}
		if n := d.Ledger().Held(); n != 0 {
			t.Errorf("a closed dispatcher holds %d rows", n)
		}
	})

	t.Run("RetryAfterALostReplyHandsOverTheCommittedClaims", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, 10, false)
		p := b.processor(t, defaultYAML)
		inserts := loseFirstReply(p, nil)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		if *inserts != 2 {
			t.Fatalf("%d inserts, want the lost one and its retry", *inserts)
		}
		rows := b.rows(t)
		got := handed(d)
		if len(got) != 2 || d.Ledger().Held() != 2 || room(d) != 8 {
			t.Fatalf("dispatcher got %d rows (holds %d, room %d), want both rows and one reservation", len(got), d.Ledger().Held(), room(d))
		}
		for _, c := range got {
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
		d := b.dispatcher(t, 2, false)
		p := b.processor(t, defaultYAML)
		loseFirstReply(p, func() {
			// The dispatcher fills up while the processor waits to retry:
			// the two slots given back on the failure are taken at once.
			d.Ledger().Hold([]outboxdb.Record{{ID: 1 << 40, ClaimToken: "x"}, {ID: 1<<40 + 1, ClaimToken: "y"}}, time.Time{})
		})
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h1")))
		// Both were claimed by the lost attempt: handed over all the same,
		// beyond the room the retry found, rather than left to their lease.
		got := handed(d)
		if len(got) != 2 || d.Ledger().Held() != 4 || room(d) != 0 {
			t.Fatalf("dispatcher got %d rows (holds %d, room %d), want the 2 recovered ones beyond its room", len(got), d.Ledger().Held(), room(d))
		}
		for key, r := range b.rows(t) {
			if r.Status != "IN_PROGRESS" || r.AttemptCount != 1 {
				t.Errorf("row %s = %s at attempt %d, want handed over at attempt 1", key, r.Status, r.AttemptCount)
			}
		}
	})

	t.Run("WaitsForRoomWhileDeliveryMoves", func(t *testing.T) {
		t.Parallel()
		b, d, p, first := fullDispatcher(t)
		waits := recordWaits(p)
		d.Ledger().Settle([]outboxdb.ClaimRef{first[0].Ref()}) // h1 delivered: one slot free
		done := make(chan error, 1)
		go func() {
			_, err := p.ProcessBatch(context.Background(), service.MessageBatch{
				kmsg(topicHeartbeat, 0, 3, heartbeat("h3")), kmsg(topicHeartbeat, 0, 4, heartbeat("h4"))})
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("the batch was persisted at once (%v) with room for one of its two rows while delivery moves: want a wait for room", err)
		case <-time.After(200 * time.Millisecond):
		}
		d.Ledger().Settle([]outboxdb.ClaimRef{first[1].Ref()}) // h2 delivered: room for both
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("still waiting with room for both rows")
		}
		rows := b.rows(t)
		if got := handed(d); len(got) != 2 {
			t.Fatalf("handed over %d rows once room was free, want both", len(got))
		}
		for _, key := range []string{"h3", "h4"} {
			if r := rows[key]; r.Status != "IN_PROGRESS" || r.AttemptCount != 1 {
				t.Errorf("row %s = %s at attempt %d, want handed over at attempt 1", key, r.Status, r.AttemptCount)
			}
		}
		// How long is the ledger's to say (TestLedgerReserveWithin).
		if got := waits.all(); len(got) != 1 || got[0] <= 0 {
			t.Errorf("waits observed %v, want the chunk's one wait", got)
		}
	})

	t.Run("DoesNotWaitForAHangingPlatform", func(t *testing.T) {
		t.Parallel()
		// Both slots are taken by rows whose requests never come back: no
		// row ever leaves the dispatcher.
		b, d, p, _ := fullDispatcher(t)
		waits := recordWaits(p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := p.ProcessBatch(ctx, service.MessageBatch{kmsg(topicHeartbeat, 0, 3, heartbeat("h3")),
			kmsg(topicHeartbeat, 0, 4, heartbeat("h4"))}); err != nil {
			t.Fatalf("ingest waited for a dispatcher whose rows never leave: %v", err)
		}
		rows := b.rows(t)
		for _, key := range []string{"h3", "h4"} {
			if r := rows[key]; r.Status != "PENDING" {
				t.Errorf("row %s = %s, want PENDING: the dispatcher had no room", key, r.Status)
			}
		}
		if d.Ledger().Held() != 2 {
			t.Errorf("the dispatcher holds %d rows, want its 2", d.Ledger().Held())
		}
		if got := waits.all(); len(got) != 0 {
			t.Errorf("waits observed %v, want none", got)
		}
	})

	t.Run("ChunksAreCutSmallOnlyForADispatcher", func(t *testing.T) {
		t.Parallel()
		batch := func() []*service.Message {
			var msgs []*service.Message
			for i := range 5 {
				msgs = append(msgs, kmsg(topicHeartbeat, 0, int64(i), heartbeat(fmt.Sprintf("h%d", i))))
			}
			return msgs
		}
		statements := func(b *testBundle) int {
			var n int
			if err := b.pool.QueryRow(context.Background(), `SELECT count(DISTINCT xmin::text) FROM forward_messages`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}

		b := setup(t)
		d := b.dispatcher(t, 10, false)
		p := b.processor(t, defaultYAML)
		p.chunkRows = 2
		process(t, p, batch()...)
		if n := statements(b); n != 3 {
			t.Errorf("5 records in chunks of 2 were written by %d statements, want 3", n)
		}
		if got := handed(d); len(got) != 5 {
			t.Errorf("handed over %d rows, want all 5", len(got))
		}

		alone := setup(t) // no dispatcher: nothing to wait for, one statement
		p = alone.processor(t, defaultYAML)
		p.chunkRows = 2
		process(t, p, batch()...)
		if n := statements(alone); n != 1 {
			t.Errorf("5 records without a dispatcher were written by %d statements, want 1", n)
		}
	})

	t.Run("OffByConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := b.dispatcher(t, 10, false)
		p := b.processor(t, defaultYAML+"direct_dispatch: false\n")
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("v1")))
		if r := b.rows(t)["v1"]; r.Status != "PENDING" || d.Ledger().Held() != 0 {
			t.Errorf("row %s, %d handed over: want PENDING and nothing handed over", r.Status, d.Ledger().Held())
		}
	})
}

// fullDispatcher returns a processor whose chunks wait up to an hour for
// room, and its dispatcher, with room for 2 rows, holding the 2 it returns
// (h1 and h2, handed over).
func fullDispatcher(t *testing.T) (*testBundle, *dispatch.Dispatcher, *outboxProcessor, []outboxdb.Record) {
	t.Helper()
	b := setup(t)
	d := b.dispatcher(t, 2, false)
	p := b.processor(t, defaultYAML)
	p.directWait = time.Hour
	process(t, p, kmsg(topicHeartbeat, 0, 1, heartbeat("h1")), kmsg(topicHeartbeat, 0, 2, heartbeat("h2")))
	first := handed(d)
	if len(first) != 2 {
		t.Fatalf("handed over %d rows, want 2", len(first))
	}
	return b, d, p, first
}

// roomWaits are the waits for room a processor observed.
type roomWaits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *roomWaits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.d)
}

// recordWaits makes p observe its waits for room in the returned list
// instead of its metric.
func recordWaits(p *outboxProcessor) *roomWaits {
	w := &roomWaits{}
	p.roomWaited = func(d time.Duration) {
		w.mu.Lock()
		w.d = append(w.d, d)
		w.mu.Unlock()
	}
	return w
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
