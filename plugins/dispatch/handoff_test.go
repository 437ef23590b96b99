package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/handoff"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// handOver does what the outbox processor does for a dispatcher with room:
// reserve, insert n new rows claimed for it, deliver.
func (b *testBundle) handOver(t testing.TB, d handoff.Dispatcher, n int) []outboxdb.ClaimedRow {
	t.Helper()
	granted := d.Reserve(n)
	if granted != n {
		t.Fatalf("reserved %d of %d slots", granted, n)
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
	claim := d.Claim()
	claim.Limit = granted
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

	t.Run("RegisteredWhileConnected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.newInput(t, "")
		if handoff.Lookup(b.dsn) != nil {
			t.Fatal("registered before Connect")
		}
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		if handoff.Lookup(b.dsn) != in {
			t.Fatal("not registered for its DSN after Connect")
		}
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if handoff.Lookup(b.dsn) != nil {
			t.Fatal("still registered after Close")
		}
		if in.Reserve(1) != 0 {
			t.Error("a closed input granted a reservation")
		}
		if in.Deliver(0, []outboxdb.ClaimedRow{{ID: 1, ClaimToken: "x"}}) {
			t.Error("a closed input took rows")
		}
	})

	t.Run("HandedRowsAreSentWithoutClaimStatements", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var claims atomic.Int64
		in := b.newInput(t, "poll_interval: 1h")
		in.onClaim = func() { claims.Add(1) }
		var stopIdle atomic.Pointer[context.CancelFunc]
		in.onIdle = func() {
			if c := stopIdle.Load(); c != nil {
				(*c)()
			}
		}
		listening := make(chan struct{}, 8)
		in.onListen = func() { listening <- struct{}{} }
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		<-listening // LISTEN itself wakes the input once: rows may have come before it
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
				if metaInt(t, m, metaOutboxID) != rows[j].ID || meta(t, m, metaClaimToken) != rows[j].ClaimToken ||
					metaInt(t, m, metaAttempt) != 1 || meta(t, m, metaAPIType) != outboxdb.APITypeHeartbeat {
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
		if in.room() != in.batchSize {
			t.Errorf("room %d after every ack, want %d", in.room(), in.batchSize)
		}
	})

	t.Run("ReservationsStayWithinMaxUnacked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "batch_size: 5\nmax_unacked: 5")
		if g := in.Reserve(10); g != 5 {
			t.Fatalf("granted %d of max_unacked 5", g)
		}
		if g := in.Reserve(1); g != 0 {
			t.Fatalf("granted %d beyond max_unacked", g)
		}
		if in.room() != 0 {
			t.Fatalf("claim room %d while every slot is reserved", in.room())
		}
		// The insert found 2 of the 5 keys stored already: 3 handed over,
		// the other 2 slots come back.
		in.Deliver(5, []outboxdb.ClaimedRow{{ID: 1, ClaimToken: "a"}, {ID: 2, ClaimToken: "b"}, {ID: 3, ClaimToken: "c"}})
		if g := in.Reserve(10); g != 2 {
			t.Fatalf("granted %d with 3 of 5 held, want 2", g)
		}
		in.Deliver(2, nil) // the insert failed
		if in.room() != 2 {
			t.Fatalf("claim room %d with 3 held, want 2", in.room())
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
			in.mu.Lock()
			waiting := in.waitForRoom
			in.mu.Unlock()
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the input never waited for room")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if g := in.Reserve(1); g != 0 {
			t.Fatalf("granted %d while due rows wait for room", g)
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
		in.onIdle = func() { idle <- struct{}{} }
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		got := readAsync(b, in)
		<-idle // nothing due: asleep until the poll
		id := b.insertDue(t, 1)[0]
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_records SET next_retry_at = now() + interval '200 milliseconds' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		handoff.NoteDue(b.dsn, time.Now().Add(200*time.Millisecond))
		r := <-got
		if r.err != nil || len(r.batch) != 1 || metaInt(t, r.batch[0], metaOutboxID) != id {
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
