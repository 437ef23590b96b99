package outboxdb_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

type deadLetterBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	db   *fixture.DB
}

func setupDeadLetter(t *testing.T) *deadLetterBundle {
	t.Helper()
	pool := pgtest.NewPool(t)
	return &deadLetterBundle{ctx: context.Background(), pool: pool, db: fixture.New(t, pool)}
}

// insert adds a row with the given status and returns its id.
func (b *deadLetterBundle) insert(t *testing.T, key, status string) int64 {
	t.Helper()
	r := fixture.Row{Key: key, Status: status, Partition: 3, Offset: 42, KafkaKey: []byte("k"),
		Payload: append([]byte(key), 0xff, 0x00)}
	if status != "PENDING" {
		r.Attempts = 5
	}
	if status == "FAILED" {
		r.LastHTTPStatus, r.LastError = 200, "platform errcode 998: do not resend"
	}
	return b.db.Insert(r)[0]
}

func (b *deadLetterBundle) claim(t *testing.T, limit int, lease time.Duration) []outboxdb.Record {
	t.Helper()
	rows, err := outboxdb.ClaimDeadLetters(b.ctx, b.pool, limit, lease)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func (b *deadLetterBundle) published(t *testing.T, id int64) bool {
	t.Helper()
	var ok bool
	if err := b.pool.QueryRow(b.ctx, "SELECT dead_lettered_at IS NOT NULL FROM forward_records WHERE id = $1", id).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func ids(rows []outboxdb.Record) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func refs(rows []outboxdb.Record) []outboxdb.DeadLetterRef {
	out := make([]outboxdb.DeadLetterRef, len(rows))
	for i, r := range rows {
		out[i] = r.DeadLetterRef()
	}
	return out
}

func TestDeadLetter(t *testing.T) {
	t.Parallel()

	t.Run("ClaimsOnlyUnpublishedFailedRows", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetter(t)
		f1 := b.insert(t, "f1", "FAILED")
		b.insert(t, "p", "PENDING")
		b.insert(t, "i", "IN_PROGRESS")
		b.insert(t, "s", "SUCCESS")
		f2 := b.insert(t, "f2", "FAILED")

		got := b.claim(t, 10, time.Minute)
		if !slices.Equal(ids(got), []int64{f1, f2}) {
			t.Fatalf("claimed %v, want the FAILED rows %v", ids(got), []int64{f1, f2})
		}
		r := got[0]
		if r.MessageKey != "f1" || r.APIType != "VEHICLE_EVENT" || r.KafkaTopic != "device-vehicle-event" ||
			r.KafkaPartition != 3 || r.KafkaOffset != 42 || string(r.KafkaKey) != "k" ||
			!bytes.Equal(r.Payload, []byte("f1\xff\x00")) || r.AttemptCount != 5 ||
			r.LastHTTPStatus == nil || *r.LastHTTPStatus != 200 || r.LastErrorText() != "platform errcode 998: do not resend" ||
			r.DeadLetterToken == "" || r.CreatedAt.IsZero() || r.FailedAt.IsZero() {
			t.Fatalf("row %+v", r)
		}
		if again := b.claim(t, 10, time.Minute); len(again) != 0 {
			t.Fatalf("leased rows claimed again: %v", ids(again))
		}

		// Publish f1; give f2 back.
		if n, err := outboxdb.MarkDeadLettered(b.ctx, b.pool, refs(got[:1])); err != nil || n != 1 {
			t.Fatalf("mark: %d, %v", n, err)
		}
		if n, err := outboxdb.ReleaseDeadLetters(b.ctx, b.pool, refs(got[1:]), 0); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		if !b.published(t, f1) || b.published(t, f2) {
			t.Fatal("want f1 published and f2 not")
		}
		again := b.claim(t, 10, time.Minute)
		if !slices.Equal(ids(again), []int64{f2}) || again[0].DeadLetterToken == got[1].DeadLetterToken {
			t.Fatalf("after release claimed %v, want f2 with a new token", ids(again))
		}
	})

	t.Run("ReleaseDelaysTheNextClaim", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetter(t)
		b.insert(t, "f", "FAILED")
		got := b.claim(t, 10, time.Minute)
		if n, err := outboxdb.ReleaseDeadLetters(b.ctx, b.pool, refs(got), time.Hour); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		if again := b.claim(t, 10, time.Minute); len(again) != 0 {
			t.Fatalf("a row released for an hour was claimed at once: %v", ids(again))
		}
	})

	t.Run("ExpiredLeaseIsClaimedAgainAndFencesTheOldHolder", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetter(t)
		id := b.insert(t, "f", "FAILED")
		first := b.claim(t, 10, 0) // the lease is over at once
		second := b.claim(t, 10, time.Minute)
		if !slices.Equal(ids(second), []int64{id}) || second[0].DeadLetterToken == first[0].DeadLetterToken {
			t.Fatalf("after the lease claimed %v", ids(second))
		}
		for what, f := range map[string]func() (int64, error){
			"mark":    func() (int64, error) { return outboxdb.MarkDeadLettered(b.ctx, b.pool, refs(first)) },
			"release": func() (int64, error) { return outboxdb.ReleaseDeadLetters(b.ctx, b.pool, refs(first), 0) },
		} {
			if n, err := f(); err != nil || n != 0 {
				t.Fatalf("%s by the old holder changed %d rows, %v", what, n, err)
			}
		}
		if n, err := outboxdb.MarkDeadLettered(b.ctx, b.pool, refs(second)); err != nil || n != 1 {
			t.Fatalf("mark by the holder: %d, %v", n, err)
		}
	})

	t.Run("ConcurrentClaimersNeverShareARow", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetter(t)
		rows := make([]fixture.Row, 400)
		for i := range rows {
			rows[i] = fixture.Row{Key: fmt.Sprintf("f%d", i+1), APIType: "HEARTBEAT", Status: "FAILED", LastError: "x"}
		}
		b.db.Insert(rows...)
		var (
			mu   sync.Mutex
			seen = map[int64]int{}
			wg   sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for {
					rows, err := outboxdb.ClaimDeadLetters(b.ctx, b.pool, 7, time.Minute)
					if err != nil {
						t.Error(err)
						return
					}
					if len(rows) == 0 {
						return
					}
					mu.Lock()
					for _, r := range rows {
						seen[r.ID]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(seen) != 400 {
			t.Fatalf("%d rows claimed, want 400", len(seen))
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("row %d claimed %d times", id, n)
			}
		}
	})

	t.Run("RequeueClearsThePublication", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetter(t)
		published := b.insert(t, "published", "FAILED")
		inFlight := b.insert(t, "in-flight", "FAILED")
		got := b.claim(t, 10, time.Minute)
		if _, err := outboxdb.MarkDeadLettered(b.ctx, b.pool, refs(got[:1])); err != nil {
			t.Fatal(err)
		}

		n, err := outboxdb.Requeue(b.ctx, b.pool, outboxdb.RequeueFilter{}, outboxdb.RequeueOptions{})
		if err != nil || n != 2 {
			t.Fatalf("requeue: %d, %v", n, err)
		}
		var cleared int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM forward_records WHERE status = 'PENDING'
			AND dead_lettered_at IS NULL AND dead_letter_token IS NULL AND dead_letter_lease_until IS NULL`).Scan(&cleared); err != nil {
			t.Fatal(err)
		}
		if cleared != 2 {
			t.Fatalf("%d of 2 requeued rows left the dead-letter bookkeeping", cleared)
		}
		// The publish that was under way during the requeue is fenced out.
		if n, err := outboxdb.MarkDeadLettered(b.ctx, b.pool, refs(got[1:])); err != nil || n != 0 {
			t.Fatalf("mark after the requeue: %d, %v", n, err)
		}

		// Both fail again (as the dispatcher would leave them): both are
		// published again.
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL,
			last_error = 'failed again'`); err != nil {
			t.Fatal(err)
		}
		again := b.claim(t, 10, time.Minute)
		if !slices.Equal(ids(again), []int64{published, inFlight}) || again[0].LastErrorText() != "failed again" {
			t.Fatalf("after failing again claimed %v", ids(again))
		}
	})
}
