package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestHotUpdates shows which statements on forward_deliveries are HOT
// updates (the new row version on the same page, no index entry written:
// docs/architecture.md, "A narrow state"). Each statement runs in a
// transaction of its own that reads its session's counters
// (pg_stat_get_xact_tuples_updated and _hot_updated) before and after it,
// so the figures are exact and no other session's statements count. A claim, a
// renewal, a give-back, a retry and a failure change indexed columns
// (status, next_retry_at, updated_at) and can never be HOT; the dead-letter
// claim and its give-back change only unindexed columns and are all HOT on
// a table with room on its pages (fillfactor 80, after a vacuum); marking a
// row published changes the predicate of the dead-letter index and is not.
// A delivery deletes its row instead of updating it.
func TestHotUpdates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)

	type counts struct{ updated, hot, deleted int64 }
	// measure runs fn in a transaction and returns what it did to
	// forward_deliveries.
	measure := func(t *testing.T, what string, fn func(tx pgx.Tx) error) counts {
		t.Helper()
		const read = `SELECT pg_stat_get_xact_tuples_updated('forward_deliveries'::regclass),
			pg_stat_get_xact_tuples_hot_updated('forward_deliveries'::regclass),
			pg_stat_get_xact_tuples_deleted('forward_deliveries'::regclass)`
		var before, c counts
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The counters also hold the session's earlier transactions
			// until they are flushed, which never happens within a
			// transaction: the difference is this one's.
			if err := tx.QueryRow(ctx, read).Scan(&before.updated, &before.hot, &before.deleted); err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				return err
			}
			return tx.QueryRow(ctx, read).Scan(&c.updated, &c.hot, &c.deleted)
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		c = counts{c.updated - before.updated, c.hot - before.hot, c.deleted - before.deleted}
		t.Logf("%-40s %3d updates, %3d HOT, %3d deletes", what, c.updated, c.hot, c.deleted)
		return c
	}
	vacuum := func(t *testing.T) {
		t.Helper()
		if _, err := pool.Exec(ctx, "VACUUM forward_deliveries"); err != nil {
			t.Fatal(err)
		}
	}

	const n = 120
	recs := make([]outboxdb.NewRecord, n)
	for i := range recs {
		recs[i] = pendingRec(fmt.Sprintf("hot-%03d", i), int64(i))
	}
	if c, err := outboxdb.InsertBatchCount(ctx, pool, recs); err != nil || c.Pending != n {
		t.Fatalf("inserting %d rows: %d, %v", n, c.Pending, err)
	}

	var claimed []outboxdb.Record
	claim := measure(t, "claim", func(tx pgx.Tx) (err error) {
		claimed, err = outboxdb.Claim(ctx, tx, n, time.Minute, "hot")
		return err
	})
	if len(claimed) != n {
		t.Fatalf("claimed %d rows, want %d", len(claimed), n)
	}
	refs := make([]outboxdb.ClaimRef, n)
	for i, r := range claimed {
		refs[i] = outboxdb.ClaimRef{ID: r.ID, ClaimToken: r.ClaimToken}
	}
	vacuum(t)
	renew := measure(t, "lease renewal", func(tx pgx.Tx) error {
		_, err := outboxdb.RenewLeases(ctx, tx, refs, 2*time.Minute)
		return err
	})
	vacuum(t)
	// The first tenth is given back, then claimed again; of the rest, a
	// tenth (every tenth row, spread over the pages) fails, the others are
	// retried or delivered.
	release := measure(t, "give-back", func(tx pgx.Tx) error {
		_, err := outboxdb.Release(ctx, tx, refs[:n/10], 0, "shutting down")
		return err
	})
	var results, failures, deliveries []outboxdb.Result
	for i, r := range refs[n/10:] {
		res := outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Sent: true}
		switch {
		case i%10 == 0:
			res.Status, res.HTTPStatus, res.Error, res.Class = outboxdb.StatusFailed, 400, "http 400", outboxdb.ClassRejected
			failures = append(failures, res)
		case i%2 == 0:
			res.Status, res.HTTPStatus, res.Error, res.RetryIn = outboxdb.StatusPending, 503, "http 503", time.Minute
			results = append(results, res)
		default:
			res.Status, res.HTTPStatus = outboxdb.StatusSuccess, 200
			deliveries = append(deliveries, res)
		}
	}
	vacuum(t)
	retry := measure(t, "result: retry", func(tx pgx.Tx) error {
		_, err := outboxdb.RecordResults(ctx, tx, results, outboxdb.RecordOptions{})
		return err
	})
	vacuum(t)
	fail := measure(t, "result: FAILED", func(tx pgx.Tx) error {
		_, err := outboxdb.RecordResults(ctx, tx, failures, outboxdb.RecordOptions{})
		return err
	})
	vacuum(t)
	deliver := measure(t, "result: SUCCESS", func(tx pgx.Tx) error {
		_, err := outboxdb.RecordResults(ctx, tx, deliveries, outboxdb.RecordOptions{})
		return err
	})

	vacuum(t)
	var dead []outboxdb.Record
	deadClaim := measure(t, "dead-letter claim", func(tx pgx.Tx) (err error) {
		dead, err = outboxdb.ClaimDeadLetters(ctx, tx, n, time.Minute)
		return err
	})
	if len(dead) != len(failures) {
		t.Fatalf("claimed %d dead letters, want the %d FAILED rows", len(dead), len(failures))
	}
	deadRefs := make([]outboxdb.DeadLetterRef, len(dead))
	for i, r := range dead {
		deadRefs[i] = r.DeadLetterRef()
	}
	vacuum(t)
	deadRelease := measure(t, "dead-letter give-back", func(tx pgx.Tx) error {
		_, err := outboxdb.ReleaseDeadLetters(ctx, tx, deadRefs[:len(deadRefs)/2], 0)
		return err
	})
	vacuum(t)
	deadMark := measure(t, "dead letter published", func(tx pgx.Tx) error {
		_, err := outboxdb.MarkDeadLettered(ctx, tx, deadRefs[len(deadRefs)/2:])
		return err
	})

	var problems []string
	never := map[string]counts{"claim": claim, "lease renewal": renew, "give-back": release, "result: retry": retry,
		"result: FAILED": fail, "dead letter published": deadMark}
	for what, c := range never {
		if c.updated == 0 || c.hot != 0 {
			problems = append(problems, fmt.Sprintf("%s: %d updates, %d HOT; want updates, none HOT (it changes indexed columns)", what, c.updated, c.hot))
		}
	}
	for what, c := range map[string]counts{"dead-letter claim": deadClaim, "dead-letter give-back": deadRelease} {
		if c.updated == 0 || c.hot != c.updated {
			problems = append(problems, fmt.Sprintf("%s: %d updates, %d HOT; want every one HOT (it changes no indexed column)", what, c.updated, c.hot))
		}
	}
	if deliver.updated != 0 || deliver.deleted != int64(len(deliveries)) {
		problems = append(problems, fmt.Sprintf("result: SUCCESS: %d updates, %d deletes; want the %d delivery rows deleted, none updated",
			deliver.updated, deliver.deleted, len(deliveries)))
	}
	if len(problems) > 0 {
		t.Error(strings.Join(problems, "\n"))
	}
}
