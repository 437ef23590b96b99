package outboxdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestFencesHoldWhenTheRowChangesUnderTheWrite: a write fenced by a claim
// token that finds its row locked by another transaction waits, and when
// that transaction commits PostgreSQL checks the row's new version against
// the write's conditions again. The token each write compares is looked up
// in one value made from the batch (docs/architecture.md, "A queue's
// statistics are not trusted"); that recheck must use it too: a row claimed
// again meanwhile (a new token) is left alone, a row changed otherwise
// (same token) is written. Each case runs both ways, so neither outcome
// can pass by accident.
func TestFencesHoldWhenTheRowChangesUnderTheWrite(t *testing.T) {
	t.Parallel()
	type claimed struct {
		id    int64
		token string
	}
	cases := []struct {
		name string
		// dead: the row is FAILED and claimed for the dead-letter topic
		// (dead_letter_token) instead of claimed for delivery.
		dead  bool
		write func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error)
	}{
		{"result write, delivered", false, func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error) {
			ids, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{ID: c.id, ClaimToken: c.token,
				Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}}, outboxdb.RecordOptions{})
			return int64(len(ids)), err
		}},
		{"result write, retry", false, func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error) {
			ids, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{ID: c.id, ClaimToken: c.token,
				Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 503, Error: "unavailable"}}, outboxdb.RecordOptions{})
			return int64(len(ids)), err
		}},
		{"give-back", false, func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error) {
			return outboxdb.Release(ctx, pool, []outboxdb.ClaimRef{{ID: c.id, ClaimToken: c.token}}, 0, "given back")
		}},
		{"dead-letter mark", true, func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error) {
			return outboxdb.MarkDeadLettered(ctx, pool, []outboxdb.DeadLetterRef{{ID: c.id, Token: c.token}})
		}},
		{"dead-letter release", true, func(ctx context.Context, pool *pgxpool.Pool, c claimed) (int64, error) {
			return outboxdb.ReleaseDeadLetters(ctx, pool, []outboxdb.DeadLetterRef{{ID: c.id, Token: c.token}}, 0)
		}},
	}
	for _, tc := range cases {
		for _, reclaimed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/reclaimed=%v", tc.name, reclaimed), func(t *testing.T) {
				t.Parallel()
				pool := pgtest.NewPool(t)
				db := fixture.New(t, pool)
				ctx := context.Background()
				var c claimed
				tokenColumn := "claim_token"
				if tc.dead {
					ids, tokens := deadLetterClaims(t, db, 1)
					c = claimed{ids[0], tokens[0]}
					tokenColumn = "dead_letter_token"
				} else {
					db.InsertDue("k", 1)
					r := db.ClaimN(1)[0]
					c = claimed{r.ID, r.ClaimToken}
				}

				// Another transaction changes the row and holds it: it
				// claims it again (a new token), or only touches it.
				change := "updated_at = now()"
				if reclaimed {
					change = tokenColumn + " = gen_random_uuid()"
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := tx.Exec(ctx, "UPDATE forward_deliveries SET "+change+" WHERE id = $1", c.id); err != nil {
					t.Fatal(err)
				}

				type outcome struct {
					n   int64
					err error
				}
				done := make(chan outcome, 1)
				go func() {
					n, err := tc.write(ctx, pool, c)
					done <- outcome{n, err}
				}()
				waitForRowLockWait(t, pool)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				var got outcome
				select {
				case got = <-done:
				case <-time.After(30 * time.Second):
					t.Fatal("the write did not finish after the other transaction committed")
				}
				if got.err != nil {
					t.Fatal(got.err)
				}
				want := int64(1)
				if reclaimed {
					want = 0
				}
				if got.n != want {
					t.Fatalf("the write changed %d rows, want %d (row %s under the write)", got.n, want,
						map[bool]string{true: "claimed again", false: "touched, same token"}[reclaimed])
				}
				if reclaimed && !tc.dead {
					if s := db.State(c.id); s.Status != "IN_PROGRESS" || fixture.Str(s.ClaimToken) == c.token {
						t.Fatalf("the row claimed again is %s with token %s, want IN_PROGRESS under the new claim",
							s.Status, fixture.Str(s.ClaimToken))
					}
				}
			})
		}
	}
}

// waitForRowLockWait waits until a session of pool's database waits for a
// lock (the fenced write, blocked on the row the test's transaction holds).
func waitForRowLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the write never waited for the row the test's transaction holds")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
