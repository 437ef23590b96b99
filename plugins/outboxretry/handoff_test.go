package outboxretry

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// handOver does what the outbox processor does for a dispatcher with room:
// reserve, insert n new rows claimed for it, deliver.
func (b *testBundle) handOver(t testing.TB, in *outboxRetry, n int) []outboxdb.Record {
	t.Helper()
	d := in.d
	granted := d.ReserveWithin(context.Background(), make([]int, n), 0)
	if granted.Rows != n {
		t.Fatalf("reserved %d of %d slots", granted.Rows, n)
	}
	first := b.keys.Add(int64(n)) - int64(n)
	recs := make([]outboxdb.NewRecord, n)
	for i := range recs {
		recs[i] = outboxdb.NewRecord{
			MessageKey: fmt.Sprintf("direct-%d", first+int64(i)), APIType: outboxdb.APITypeHeartbeat,
			KafkaTopic: "device-heartbeat", KafkaPartition: 1, KafkaOffset: first + int64(i),
			Payload: []byte(`{}`), Status: outboxdb.StatusPending,
		}
	}
	claim := d.DirectClaim()
	claim.Limit = granted.Rows
	_, rows, err := outboxdb.InsertBatchClaim(b.ctx, b.pool, recs, claim)
	if err != nil {
		d.Deliver(granted, nil)
		t.Fatal(err)
	}
	if len(rows) != n {
		t.Fatalf("inserted %d claimed rows, want %d", len(rows), n)
	}
	if !d.Deliver(granted, rows) {
		t.Fatal("the dispatcher refused the rows")
	}
	return rows
}

type readResult struct {
	batch service.MessageBatch
	err   error
}

// readAsync reads one batch in the background (the engine's only reader
// meanwhile) and acks it.
func readAsync(b *testBundle, in *outboxRetry) <-chan readResult {
	got := make(chan readResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		batch, ack, err := in.ReadBatch(ctx)
		if err == nil {
			_ = ack(b.ctx, nil)
		}
		got <- readResult{batch, err}
	}()
	return got
}

func TestHandoff(t *testing.T) {
	t.Parallel()

	t.Run("RegisteredInItsStreamUntilClosed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.newInput(t, "")
		hub, err := dispatch.HubFor(b.res, b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if hub.Dispatcher() != in.d {
			t.Fatal("the input is not the dispatcher of its stream and database")
		}
		if other, _ := dispatch.HubFor(service.MockResources(), b.dsn); other.Dispatcher() != nil {
			t.Fatal("another stream on the same database sees the input")
		}
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if hub.Dispatcher() != nil {
			t.Fatal("still registered after Close")
		}
		if g := in.d.ReserveWithin(context.Background(), []int{1}, 0); g.Rows != 0 {
			t.Error("a closed input granted a reservation")
		}
		if in.d.Deliver(dispatch.Grant{}, []outboxdb.Record{{ID: 1, ClaimToken: "x"}}) {
			t.Error("a closed input took rows")
		}
	})

	t.Run("SecondInputOnTheSameDatabaseIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.newInput(t, "")
		conf, err := outboxRetrySpec().ParseYAML(fmt.Sprintf("dsn: %q", b.dsn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newOutboxRetryFromParsed(conf, b.res); err == nil {
			t.Fatal("a second outbox_retry input on the same database in one stream was accepted")
		}
	})

	t.Run("HandedRowsAreSentWithoutClaimStatements", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var claims atomic.Int64
		in := b.newInput(t, "poll_interval: 1h")
		in.d.OnClaim = func() { claims.Add(1) }
		var stopIdle atomic.Pointer[context.CancelFunc]
		in.d.OnIdle = func() {
			if c := stopIdle.Load(); c != nil {
				(*c)()
			}
		}
		listening := make(chan struct{}, 8)
		in.d.OnListen = func() { listening <- struct{}{} }
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		// LISTEN itself wakes the input once (rows may have come before
		// it): pending once OnListen ran, so that the first claim drains it.
		<-listening
		// readUntilIdle reads until the input starts waiting for work.
		readUntilIdle := func() {
			ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			stopIdle.Store(&cancel)
			defer stopIdle.Store(nil)
			if batch, _, err := in.ReadBatch(ctx); err != context.Canceled {
				t.Fatalf("read %d messages (%v), want an idle wait", len(batch), err)
			}
		}
		readUntilIdle() // the first read claims once: rows may be due from before the start
		if claims.Load() != 1 {
			t.Fatalf("%d claims at start, want 1", claims.Load())
		}

		const rounds = 20
		for i := range rounds {
			rows := b.handOver(t, in, 3)
			batch, ack := read(t, in)
			if len(batch) != 3 {
				t.Fatalf("round %d: got %d messages, want the 3 handed over", i, len(batch))
			}
			for j, m := range batch {
				if metaInt(t, m, msgmeta.OutboxID) != rows[j].ID || meta(t, m, msgmeta.ClaimToken) != rows[j].ClaimToken ||
					metaInt(t, m, msgmeta.Attempt) != 1 || meta(t, m, msgmeta.APIType) != outboxdb.APITypeHeartbeat {
					t.Fatalf("round %d: message %d does not carry row %+v", i, j, rows[j])
				}
			}
			if err := ack(b.ctx, nil); err != nil {
				t.Fatal(err)
			}
			readUntilIdle()
		}
		// With rows coming in memory and nothing due in the database, the
		// input never asked the database for work again.
		if n := claims.Load(); n != 1 {
			t.Errorf("%d claim statements for %d handed-over batches, want only the first", n, rounds)
		}
		if rows, _ := in.d.Ledger().Room(); rows != in.d.Config().MaxUnacked {
			t.Errorf("room %d after every ack, want %d", rows, in.d.Config().MaxUnacked)
		}
	})

	t.Run("ReservationsStayWithinMaxUnacked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "batch_size: 5\nmax_unacked: 5")
		d := in.d
		g := d.ReserveWithin(context.Background(), make([]int, 10), 0)
		if g.Rows != 5 {
			t.Fatalf("granted %d of max_unacked 5", g.Rows)
		}
		if g := d.ReserveWithin(context.Background(), []int{1}, 0); g.Rows != 0 {
			t.Fatalf("granted %d beyond max_unacked", g.Rows)
		}
		if rows, _ := d.Ledger().Room(); rows != 0 {
			t.Fatalf("claim room %d while every slot is reserved", rows)
		}
		// The insert found 2 of the 5 keys stored already: 3 handed over,
		// the other 2 slots come back.
		d.Deliver(g, []outboxdb.Record{{ID: 1, ClaimToken: "a"}, {ID: 2, ClaimToken: "b"}, {ID: 3, ClaimToken: "c"}})
		g = d.ReserveWithin(context.Background(), make([]int, 10), 0)
		if g.Rows != 2 {
			t.Fatalf("granted %d with 3 of 5 held, want 2", g.Rows)
		}
		d.Deliver(g, nil) // the insert failed
		if rows, _ := d.Ledger().Room(); rows != 2 {
			t.Fatalf("claim room %d with 3 held, want 2", rows)
		}
	})

	t.Run("HandOverStopsAtMaxUnackedDirect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "batch_size: 5\nmax_unacked: 10\nmax_unacked_direct: 4")
		d := in.d
		g := d.ReserveWithin(context.Background(), make([]int, 10), 0)
		if g.Rows != 4 {
			t.Fatalf("granted %d with max_unacked_direct 4, want 4", g.Rows)
		}
		d.Deliver(g, []outboxdb.Record{{ID: 1, ClaimToken: "a"}, {ID: 2, ClaimToken: "b"}, {ID: 3, ClaimToken: "c"}, {ID: 4, ClaimToken: "d"}})
		if g := d.ReserveWithin(context.Background(), []int{1}, 0); g.Rows != 0 {
			t.Fatalf("granted %d beyond max_unacked_direct", g.Rows)
		}
		if rows, _ := d.Ledger().Room(); rows != 6 {
			t.Fatalf("claim room %d with 4 of max_unacked 10 held, want 6", rows)
		}
	})

	t.Run("DueRowsInTheDatabaseAreNotStarved", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "batch_size: 2\nmax_unacked: 2")
		b.insertDue(t, 4)
		_, ack := read(t, in) // a full claim: more may be due
		got := readAsync(b, in)
		// While the input waits for room to claim, new rows are not handed
		// to it: they would take the room the due rows are waiting for.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if in.d.Ledger().WaitingForRoom() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the input never waited for room")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if g := in.d.ReserveWithin(context.Background(), []int{1}, 0); g.Rows != 0 {
			t.Fatalf("granted %d while due rows wait for room", g.Rows)
		}
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil || len(r.batch) != 2 {
			t.Fatalf("after the ack got %d messages (%v), want the 2 other due rows", len(r.batch), r.err)
		}
	})

	t.Run("AnnouncedRetryIsClaimedWhenDue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		idle := make(chan struct{}, 64)
		// Only the announcement can wake it: no notification, polls an hour apart.
		in := b.newInput(t, "poll_interval: 1h")
		in.d.OnIdle = func() { idle <- struct{}{} }
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		got := readAsync(b, in)
		<-idle // nothing due: asleep until the poll
		id := b.insertDue(t, 1)[0]
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() + interval '200 milliseconds' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		in.d.DueAt(time.Now().Add(200 * time.Millisecond))
		r := <-got
		if r.err != nil || len(r.batch) != 1 || metaInt(t, r.batch[0], msgmeta.OutboxID) != id {
			t.Fatalf("got %d messages (%v), want the announced retry %d", len(r.batch), r.err, id)
		}
	})

	t.Run("CloseGivesBackHandedRowsNeverSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "batch_size: 2")
		sent := b.handOver(t, in, 2)
		batch, _ := read(t, in) // emitted, never acked: may have reached the platform
		if len(batch) != 2 {
			t.Fatalf("read %d messages, want the 2 first handed over", len(batch))
		}
		unsent := b.handOver(t, in, 2) // still queued at Close
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		for _, r := range unsent {
			if s := b.row(t, r.ID); s.Status != "PENDING" || s.AttemptCount != 0 || !s.Due {
				t.Errorf("never sent row %d: %+v, want PENDING, due, as if never claimed", r.ID, s)
			}
			if logs := b.logStatuses(t, r.ID); len(logs) != 0 {
				t.Errorf("never sent row %d logged %v, want no attempt", r.ID, logs)
			}
		}
		for _, r := range sent {
			if s := b.row(t, r.ID); s.Status != "PENDING" || s.AttemptCount != 1 {
				t.Errorf("sent row %d: %+v, want PENDING with its attempt counted", r.ID, s)
			}
			if logs := b.logStatuses(t, r.ID); len(logs) != 1 || logs[0] != "PENDING" {
				t.Errorf("sent row %d logged %v, want the released attempt", r.ID, logs)
			}
		}
	})
}
