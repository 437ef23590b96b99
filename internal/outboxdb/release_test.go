package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestRelease(t *testing.T) {
	t.Parallel()

	var seq atomic.Int64
	claimOne := func(t *testing.T, b *fixture.DB) outboxdb.Record {
		t.Helper()
		b.InsertDue(fmt.Sprintf("due-%d", seq.Add(1)), 1)
		res := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "holder", MaxAttempts: 5})
		if len(res.Claimed) != 1 {
			t.Fatalf("claimed %d rows, want 1", len(res.Claimed))
		}
		return res.Claimed[0]
	}

	t.Run("NackedRowIsDueAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		r := claimOne(t, b)
		n, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{r.Ref()}, 0, "nacked: output failed")
		if err != nil || n != 1 {
			t.Fatalf("released %d rows, err %v; want 1", n, err)
		}
		s := b.State(r.ID)
		if s.Status != "PENDING" || s.ClaimToken != nil || s.ClaimedBy != nil || s.DueInMs == nil || *s.DueInMs > 0 ||
			s.AttemptCount != 1 || s.LastError == nil || *s.LastError != "nacked: output failed" {
			t.Fatalf("row after release: %+v, want PENDING, due now, claim cleared, attempt still counted", s)
		}
		if logs := b.Logs(r.ID); len(logs) != 1 || logs[0].Status != "PENDING" || logs[0].Attempt != 1 {
			t.Fatalf("logs %+v, want the released attempt", logs)
		}
		again := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "next", MaxAttempts: 5})
		if len(again.Claimed) != 1 || again.Claimed[0].ID != r.ID || again.Claimed[0].AttemptCount != 2 {
			t.Fatalf("claim after release: %+v, want the row at attempt 2", again)
		}
	})

	t.Run("DelayKeepsRowBack", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		r := claimOne(t, b)
		if _, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{r.Ref()}, time.Hour, "nacked"); err != nil {
			t.Fatal(err)
		}
		if s := b.State(r.ID); s.Status != "PENDING" || s.DueInMs == nil || *s.DueInMs < 59*60*1000 {
			t.Fatalf("row %+v, want PENDING due in an hour", s)
		}
		if again := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "next"}); len(again.Claimed) != 0 {
			t.Fatalf("claimed a row released with a delay")
		}
	})

	t.Run("UnsentClaimIsUndone", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		r := claimOne(t, b)
		n, err := outboxdb.ReleaseUnsent(b.Ctx, b.Pool, []outboxdb.ClaimRef{r.Ref()})
		if err != nil || n != 1 {
			t.Fatalf("released %d rows, err %v; want 1", n, err)
		}
		if s := b.State(r.ID); s.Status != "PENDING" || s.AttemptCount != 0 || s.ClaimToken != nil || s.LastError != nil || *s.DueInMs > 0 {
			t.Fatalf("row %+v, want PENDING at attempt 0, due now", s)
		}
		if logs := b.Logs(r.ID); len(logs) != 0 {
			t.Fatalf("logs %+v, want none for an attempt never made", logs)
		}
	})

	t.Run("FencedByTokenAndStatus", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		r := claimOne(t, b)
		other := claimOne(t, b)
		for _, ref := range []outboxdb.ClaimRef{
			{ID: r.ID, ClaimToken: other.ClaimToken}, // someone else's token
			{ID: r.ID, ClaimToken: "not-a-uuid"},     // garbage matches nothing, fails nothing
			{ID: r.ID + 1000, ClaimToken: r.ClaimToken},
		} {
			if n, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{ref}, 0, "x"); err != nil || n != 0 {
				t.Fatalf("release %+v: %d rows, err %v; want nothing changed", ref, n, err)
			}
		}
		// A result already written (the token stays) is not undone.
		if _, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{{ID: r.ID, ClaimToken: r.ClaimToken,
			Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		if n, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{r.Ref(), other.Ref()}, 0, "late nack"); err != nil || n != 1 {
			t.Fatalf("released %d rows, err %v; want only the unfinished one", n, err)
		}
		if s := b.State(r.ID); s.Status != "SUCCESS" {
			t.Fatalf("finished row became %s", s.Status)
		}
	})

	t.Run("BatchReleaseNotifies", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		b.InsertDue("due", 500)
		res := b.Claim(outboxdb.ClaimParams{Limit: 500, Lease: time.Minute, Claimer: "holder"})
		refs := make([]outboxdb.ClaimRef, len(res.Claimed))
		for i, r := range res.Claimed {
			refs[i] = r.Ref()
		}

		conn := pgtest.Listen(t, b.Pool, outboxdb.NotifyChannel)

		n, err := outboxdb.Release(b.Ctx, b.Pool, refs, 0, strings.Repeat("é", 2000)+"\x00\xff")
		if err != nil || n != 500 {
			t.Fatalf("released %d rows, err %v; want 500", n, err)
		}
		if got := b.Count("status = 'PENDING' AND claim_token IS NULL AND next_retry_at <= now()"); got != 500 {
			t.Fatalf("%d rows due again, want 500", got)
		}
		ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
		defer cancel()
		note, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no notification after the release: %v", err)
		}
		if note.Channel != outboxdb.NotifyChannel {
			t.Fatalf("notified on %q", note.Channel)
		}
	})

	t.Run("NothingToRelease", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		if n, err := outboxdb.Release(b.Ctx, b.Pool, nil, 0, "x"); err != nil || n != 0 {
			t.Fatalf("%d, %v", n, err)
		}
	})
}
