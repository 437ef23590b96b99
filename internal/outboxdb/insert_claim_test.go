package outboxdb_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestInsertBatchClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ClaimsTheFirstPendingRowsUpToTheLimit", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("old", 1)}); err != nil {
			t.Fatal(err)
		}
		bad := pendingRec("bad", 3)
		bad.Status, bad.LastError = outboxdb.StatusFailed, "payload is not JSON"
		recs := []outboxdb.NewRecord{
			pendingRec("z-first", 2), // batch order, not key order, decides
			bad,
			pendingRec("old", 4), // already stored: takes a slot, but neither claimed nor counted
			pendingRec("b-second", 5),
			pendingRec("z-first", 6), // duplicate in the batch
			pendingRec("a-third", 7),
		}
		counts, claimed, err := outboxdb.InsertBatchClaim(ctx, pool, recs, outboxdb.DirectClaim{
			Limit: 3, Lease: time.Minute, Claimer: "me",
		})
		if err != nil {
			t.Fatal(err)
		}
		if counts.Pending != 1 || counts.Failed != 1 {
			t.Errorf("counts %+v, want 1 PENDING (a-third) and 1 FAILED besides the claimed", counts)
		}
		if len(claimed) != 2 || claimed[0].ID > claimed[1].ID ||
			claimed[0].MessageKey+","+claimed[1].MessageKey != "b-second,z-first" { // ids follow key order
			t.Fatalf("claimed %+v, want b-second and z-first, by id", claimed)
		}
		stored := readRows(t, pool)
		for _, c := range claimed {
			src := recs[0]
			if c.MessageKey == "b-second" {
				src = recs[3]
			}
			if c.AttemptCount != 1 || c.ClaimToken == "" || c.KafkaOffset != src.KafkaOffset ||
				!bytes.Equal(c.Payload, src.Payload) || !bytes.Equal(c.KafkaKey, src.KafkaKey) ||
				c.APIType != src.APIType || c.KafkaTopic != src.KafkaTopic || c.KafkaPartition != src.KafkaPartition {
				t.Errorf("claimed row %+v does not carry its record %+v", c, src)
			}
			if d := c.LeaseExpiresAt().Sub(c.CreatedAt); d < 59*time.Second || d > 61*time.Second {
				t.Errorf("%s: lease ends %v after creation, want 1m", c.MessageKey, d)
			}
			s := stored[c.MessageKey]
			if s.ID != c.ID || s.Status != "IN_PROGRESS" || s.AttemptCount != 1 {
				t.Errorf("stored %s: %+v, want IN_PROGRESS at attempt 1 with id %d", c.MessageKey, s, c.ID)
			}
			var token, by string
			if err := pool.QueryRow(ctx, `SELECT claim_token::text, claimed_by FROM forward_records
				WHERE id = $1 AND claimed_at IS NOT NULL AND next_retry_at = $2`, c.ID, c.LeaseExpiresAt()).Scan(&token, &by); err != nil {
				t.Fatalf("%s: claim columns: %v", c.MessageKey, err)
			}
			if token != c.ClaimToken || by != "me" {
				t.Errorf("%s: stored claim %s by %s, want %s by me", c.MessageKey, token, by, c.ClaimToken)
			}
		}
		if s := stored["a-third"]; s.Status != "PENDING" || s.AttemptCount != 0 {
			t.Errorf("a-third %+v, want PENDING beyond the limit", s)
		}
		if s := stored["old"]; s.KafkaOffset != 1 || s.Status != "PENDING" {
			t.Errorf("old %+v, want the first copy untouched", s)
		}

		// A claimed row is fenced like any claim: a result with its token is
		// recorded, and so it counts as an attempt of the dispatcher's.
		ids, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{
			ID: claimed[0].ID, ClaimToken: claimed[0].ClaimToken, Status: outboxdb.StatusSuccess, Sent: true,
		}}, outboxdb.RecordOptions{})

		if err != nil || len(ids) != 1 {
			t.Fatalf("recording the claimed row: %v %v", ids, err)
		}
	})

	t.Run("NoLimitClaimsNothing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		counts, claimed, err := outboxdb.InsertBatchClaim(ctx, pool,
			[]outboxdb.NewRecord{pendingRec("k1", 1), pendingRec("k2", 2)},
			outboxdb.DirectClaim{Lease: time.Minute, Claimer: "me"})
		if err != nil || len(claimed) != 0 || counts.Pending != 2 {
			t.Fatalf("got %+v %v %v, want 2 PENDING rows and no claim", counts, claimed, err)
		}
	})

	t.Run("RetryWithTheSameTokensGetsTheLostClaimsBack", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("other", 1)}); err != nil {
			t.Fatal(err)
		}
		recs := []outboxdb.NewRecord{pendingRec("k1", 2), pendingRec("other", 3), pendingRec("k2", 4), pendingRec("k3", 5)}
		c := outboxdb.DirectClaim{Limit: 3, Lease: time.Minute, Claimer: "me", Tokens: outboxdb.NewClaimTokens(3)}
		// The first call commits, but say its reply never arrived.
		if _, first, err := outboxdb.InsertBatchClaim(ctx, pool, recs, c); err != nil || len(first) != 2 {
			t.Fatalf("first call: %d claimed, %v", len(first), err)
		}
		c.Retry = true
		counts, again, err := outboxdb.InsertBatchClaim(ctx, pool, recs, c)
		if err != nil {
			t.Fatal(err)
		}
		if counts.Pending != 0 || len(again) != 2 || again[0].MessageKey != "k1" || again[1].MessageKey != "k2" {
			t.Fatalf("retry: counts %+v, claimed %+v; want k1 and k2 again and nothing new", counts, again)
		}
		// "other" took the second slot (and token) without being claimed.
		want := map[string]string{"k1": c.Tokens[0], "k2": c.Tokens[2]}
		for _, r := range again {
			if r.ClaimToken != want[r.MessageKey] || r.AttemptCount != 1 {
				t.Errorf("retry: %s token %s attempt %d, want token %s at attempt 1", r.MessageKey, r.ClaimToken, r.AttemptCount, want[r.MessageKey])
			}
		}
		// A retry granted no room claims nothing new but still gets them.
		noRoom := c
		noRoom.Limit = 0
		if _, back, err := outboxdb.InsertBatchClaim(ctx, pool, recs, noRoom); err != nil || len(back) != 2 {
			t.Fatalf("retry without room: claimed %+v, %v; want k1 and k2 again", back, err)
		}
		stored := readRows(t, pool)
		if s := stored["k3"]; s.Status != "PENDING" {
			t.Errorf("k3 %+v, want PENDING beyond the limit", s)
		}
		if s := stored["other"]; s.Status != "PENDING" || s.KafkaOffset != 1 {
			t.Errorf("other %+v, want the first copy untouched", s)
		}

		// Other tokens, a call that is not a retry, or a claim since given
		// up match nothing.
		if _, none, err := outboxdb.InsertBatchClaim(ctx, pool, recs, outboxdb.DirectClaim{Limit: 3, Lease: time.Minute, Claimer: "me", Retry: true}); err != nil || len(none) != 0 {
			t.Fatalf("fresh tokens: claimed %+v, %v; want none", none, err)
		}
		noRetry := c
		noRetry.Retry = false
		if _, none, err := outboxdb.InsertBatchClaim(ctx, pool, recs, noRetry); err != nil || len(none) != 0 {
			t.Fatalf("same tokens, not a retry: claimed %+v, %v; want none", none, err)
		}
		if n, err := outboxdb.ReleaseUnsent(ctx, pool, []outboxdb.ClaimRef{again[0].Ref()}); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if _, left, err := outboxdb.InsertBatchClaim(ctx, pool, recs, c); err != nil || len(left) != 1 || left[0].MessageKey != "k2" {
			t.Fatalf("after releasing k1: claimed %+v, %v; want k2 only", left, err)
		}
	})

	t.Run("ExpiredLeaseIsClaimedAgain", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		_, claimed, err := outboxdb.InsertBatchClaim(ctx, pool, []outboxdb.NewRecord{pendingRec("k1", 1)},
			outboxdb.DirectClaim{Limit: 1, Lease: time.Second, Claimer: "crashed"})
		if err != nil || len(claimed) != 1 {
			t.Fatal(claimed, err)
		}
		// The holder dies; after its lease the row is due for anyone, with
		// the lost attempt logged.
		if _, err := pool.Exec(ctx, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "rescuer", MaxAttempts: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Claimed) != 1 || res.Claimed[0].AttemptCount != 2 || res.Claimed[0].ClaimToken == claimed[0].ClaimToken {
			t.Fatalf("reclaim %+v, want attempt 2 under a new token", res.Claimed)
		}
		var logged string
		if err := pool.QueryRow(ctx, `SELECT result_status FROM forward_retry_logs WHERE record_id = $1`, claimed[0].ID).Scan(&logged); err != nil || logged != "LEASE_EXPIRED" {
			t.Fatalf("attempt log %q %v, want LEASE_EXPIRED", logged, err)
		}
	})
}
