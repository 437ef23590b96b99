package outboxdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// TestClaimByteBudget: a claim takes due rows while their payloads fit the
// budget, and always the first one, so a message larger than the budget is
// still delivered, alone.
func TestClaimByteBudget(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	big := make([]byte, 0, 3000)
	big = fmt.Appendf(big, `{"pad":"%0900d"}`, 0)
	ids := db.Insert(
		fixture.Row{Key: "a", Payload: big}, fixture.Row{Key: "b", Payload: big},
		fixture.Row{Key: "c", Payload: big}, fixture.Row{Key: "d", Payload: big})
	claim := func(budget int64) []int64 {
		res := db.Claim(outboxdb.ClaimParams{Limit: 10, MaxBytes: budget, Lease: time.Minute, Claimer: "me"})
		out := make([]int64, len(res.Claimed))
		for i, r := range res.Claimed {
			out[i] = r.ID
		}
		return out
	}
	size := int64(len(big))
	if got := claim(2*size + size/2); len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("budget of 2.5 rows claimed %v, want the first two due rows", got)
	}
	if got := claim(1); len(got) != 1 || got[0] != ids[2] {
		t.Fatalf("budget smaller than one row claimed %v, want the next row alone", got)
	}
	if got := claim(0); len(got) != 1 || got[0] != ids[3] {
		t.Fatalf("no budget (0) claimed %v, want the last row", got)
	}
}

func TestRenewLeases(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	db.InsertDue("r", 3)
	held := db.Claim(outboxdb.ClaimParams{Limit: 3, Lease: time.Second, Claimer: "me"}).Claimed
	if len(held) != 3 {
		t.Fatalf("claimed %d rows, want 3", len(held))
	}
	// Row 2 was lost: its lease ran out and another dispatcher claimed it.
	db.Exec(`UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, held[1].ID)
	stolen := db.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "other"}).Claimed
	if len(stolen) != 1 || stolen[0].ID != held[1].ID {
		t.Fatalf("the other dispatcher claimed %+v", stolen)
	}
	refs := []outboxdb.ClaimRef{held[0].Ref(), held[1].Ref(), held[2].Ref()}
	renewed, err := outboxdb.RenewLeases(db.Ctx, db.Pool, refs, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(renewed) != 2 {
		t.Fatalf("renewed %v, want rows %d and %d", renewed, held[0].ID, held[2].ID)
	}
	if _, ok := renewed[held[1].ID]; ok {
		t.Fatal("a lost claim was renewed")
	}
	for _, r := range []outboxdb.Record{held[0], held[2]} {
		s := db.State(r.ID)
		if s.DueInMs == nil || *s.DueInMs < (59*time.Minute).Milliseconds() || *s.ClaimToken != r.ClaimToken {
			t.Errorf("row %d after renewal: due in %v ms, token %s; want about an hour, same claim", r.ID, s.DueInMs, fixture.Str(s.ClaimToken))
		}
		if !renewed[r.ID].After(time.Now().Add(59 * time.Minute)) {
			t.Errorf("row %d: reported deadline %v", r.ID, renewed[r.ID])
		}
	}
	if s := db.State(held[1].ID); *s.ClaimedBy != "other" || *s.DueInMs > time.Minute.Milliseconds() {
		t.Errorf("the renewal changed the other dispatcher's claim: %+v", s)
	}
}

// TestSettledClaims: of the claims a renewal did not find IN_PROGRESS, those
// finished by a result written under the same claim (the holder's own
// output was faster than its acknowledgement) are settled; one taken by
// another dispatcher after its lease ran out, and one given back, are not.
func TestSettledClaims(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	db.InsertDue("s", 6)
	held := db.Claim(outboxdb.ClaimParams{Limit: 6, Lease: time.Second, Claimer: "me"}).Claimed
	if len(held) != 6 {
		t.Fatalf("claimed %d rows, want 6", len(held))
	}
	// Row 0 SUCCESS and row 1 retried (PENDING) by this holder's results.
	if _, err := outboxdb.RecordResults(db.Ctx, db.Pool, []outboxdb.Result{
		{ID: held[0].ID, ClaimToken: held[0].ClaimToken, Status: outboxdb.StatusSuccess, Sent: true},
		{ID: held[1].ID, ClaimToken: held[1].ClaimToken, Status: outboxdb.StatusPending, RetryIn: time.Minute, Sent: true, Error: "busy"},
	}, outboxdb.RecordOptions{}); err != nil {
		t.Fatal(err)
	}
	// Row 2 lost: its lease ran out and another dispatcher claimed it.
	db.Exec(`UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, held[2].ID)
	if stolen := db.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "other"}).Claimed; len(stolen) != 1 || stolen[0].ID != held[2].ID {
		t.Fatalf("the other dispatcher claimed %+v", stolen)
	}
	// Row 5 lost too: claimed by another dispatcher once its lease ran out,
	// and delivered by it (its delivery row gone).
	db.Exec(`UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, held[5].ID)
	stolen := db.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "other"}).Claimed
	if len(stolen) != 1 || stolen[0].ID != held[5].ID {
		t.Fatalf("the other dispatcher claimed %+v", stolen)
	}
	if _, err := outboxdb.RecordResults(db.Ctx, db.Pool, []outboxdb.Result{{ID: stolen[0].ID, ClaimToken: stolen[0].ClaimToken,
		Status: outboxdb.StatusSuccess, Sent: true}}, outboxdb.RecordOptions{}); err != nil {
		t.Fatal(err)
	}
	// Row 3 given back (release clears the claim).
	if _, err := outboxdb.ReleaseUnsent(db.Ctx, db.Pool, []outboxdb.ClaimRef{held[3].Ref()}); err != nil {
		t.Fatal(err)
	}

	// Row 4 still held, but locked right now by another transaction (a
	// result write under way): the renewal skips it rather than wait, which
	// could deadlock with that write.
	tx, err := db.Pool.Begin(db.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(db.Ctx) }()
	if _, err := tx.Exec(db.Ctx, `SELECT id FROM forward_deliveries WHERE id = $1 FOR UPDATE`, held[4].ID); err != nil {
		t.Fatal(err)
	}

	refs := []outboxdb.ClaimRef{held[0].Ref(), held[1].Ref(), held[2].Ref(), held[3].Ref(), held[4].Ref(), held[5].Ref()}
	ctx, cancel := context.WithTimeout(db.Ctx, 5*time.Second)
	defer cancel()
	renewed, err := outboxdb.RenewLeases(ctx, db.Pool, refs, time.Hour)
	if err != nil {
		t.Fatalf("renewal with a held row locked elsewhere: %v (it must skip the row, not wait)", err)
	}
	if len(renewed) != 0 {
		t.Fatalf("renewed %v: none of them is IN_PROGRESS under its claim and unlocked", renewed)
	}
	settled, err := outboxdb.SettledClaims(db.Ctx, db.Pool, refs, "me")
	if err != nil {
		t.Fatal(err)
	}
	if len(settled) != 3 || !settled[held[0].ID] || !settled[held[1].ID] || !settled[held[4].ID] {
		t.Fatalf("not lost %v, want rows %d and %d (finished under the same claim) and %d (skipped while locked), not %d (claimed by another), %d (given back) or %d (delivered by another)",
			settled, held[0].ID, held[1].ID, held[4].ID, held[2].ID, held[3].ID, held[5].ID)
	}
	if err := tx.Rollback(db.Ctx); err != nil {
		t.Fatal(err)
	}
	if renewed, err = outboxdb.RenewLeases(db.Ctx, db.Pool, refs[4:], time.Hour); err != nil || len(renewed) != 1 {
		t.Fatalf("the row unlocked again: renewed %v, %v; want it renewed", renewed, err)
	}
}

// TestGiveBacksForLackOfLeaseAreBounded: a claim given back unsent for lack
// of lease keeps the row's attempts, up to MaxLeaseReturns times in a row;
// the next one counts (and is logged), so a row is never returned forever.
func TestGiveBacksForLackOfLeaseAreBounded(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	id := db.InsertDue("g", 1)[0]
	giveBack := func() {
		t.Helper()
		c := db.ClaimN(1)
		if len(c) != 1 {
			t.Fatalf("nothing to claim: %+v", db.State(id))
		}
		if _, err := outboxdb.RecordResults(db.Ctx, db.Pool, []outboxdb.Result{{
			ID: c[0].ID, ClaimToken: c[0].ClaimToken, Status: outboxdb.StatusPending,
			Undo: true, ForLease: true, Error: "not sent: lease",
		}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= outboxdb.MaxLeaseReturns; i++ {
		giveBack()
		if s := db.State(id); s.AttemptCount != 0 || s.LeaseReturns != i || len(db.Logs(id)) != 0 {
			t.Fatalf("give-back %d: attempts %d, returns %d, logs %v; want the attempt undone and counted as a return",
				i, s.AttemptCount, s.LeaseReturns, db.Logs(id))
		}
	}
	giveBack()
	s := db.State(id)
	if s.AttemptCount != 1 || s.LeaseReturns != 0 || s.Status != "PENDING" || fixture.Str(s.LastError) != "not sent: lease" {
		t.Fatalf("give-back past the bound: %+v; want the attempt counted and the returns reset", s)
	}
	if logs := db.Logs(id); len(logs) != 1 || logs[0].Status != "PENDING" || logs[0].Attempt != 1 {
		t.Fatalf("logs %+v, want one PENDING attempt", logs)
	}

	// A recorded attempt resets the count.
	giveBack()
	c := db.ClaimN(1)
	if _, err := outboxdb.RecordResults(db.Ctx, db.Pool, []outboxdb.Result{{
		ID: c[0].ID, ClaimToken: c[0].ClaimToken, Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 503,
	}}, outboxdb.RecordOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := db.State(id); s.LeaseReturns != 0 {
		t.Fatalf("lease returns %d after a real attempt, want 0", s.LeaseReturns)
	}
}

func TestFailedResultsCarryTheirClass(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	db.InsertDue("f", 3)
	c := db.ClaimN(3)
	results := []outboxdb.Result{
		{ID: c[0].ID, ClaimToken: c[0].ClaimToken, Status: outboxdb.StatusFailed, Class: outboxdb.ClassRejected, Error: "errcode 998"},
		{ID: c[1].ID, ClaimToken: c[1].ClaimToken, Status: outboxdb.StatusFailed, Class: outboxdb.ClassInvalid, Error: "mapping: x"},
		{ID: c[2].ID, ClaimToken: c[2].ClaimToken, Status: outboxdb.StatusFailed, Error: "giving up"},
	}
	if _, err := outboxdb.RecordResults(db.Ctx, db.Pool, results, outboxdb.RecordOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"REJECTED", "INVALID", "TRANSIENT"} {
		if got := fixture.Str(db.State(c[i].ID).FailureClass); got != want {
			t.Errorf("row %d: failure class %s, want %s", i, got, want)
		}
	}
	if n := db.Count("status = 'FAILED' AND failed_at IS NULL"); n != 0 {
		t.Errorf("%d FAILED rows without failed_at", n)
	}
}
