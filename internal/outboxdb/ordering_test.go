package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// orderedRec is a PENDING vehicle event of berth okey.
func orderedRec(key, okey string, offset int64) outboxdb.NewRecord {
	r := pendingRec(key, offset)
	r.OrderingKey = okey
	return r
}

type orderingBundle struct {
	*fixture.DB
	t *testing.T
}

func setupOrdering(t *testing.T) orderingBundle {
	t.Helper()
	return orderingBundle{DB: fixture.New(t, pgtest.NewPool(t)), t: t}
}

func (b orderingBundle) insert(recs ...outboxdb.NewRecord) {
	b.t.Helper()
	if _, err := outboxdb.InsertBatchCount(b.Ctx, b.Pool, recs); err != nil {
		b.t.Fatal(err)
	}
}

// claimKeys claims every due row and returns their message keys, by id.
func (b orderingBundle) claimKeys() ([]string, map[string]outboxdb.Record) {
	b.t.Helper()
	rows := b.ClaimN(100)
	keys := make([]string, len(rows))
	byKey := map[string]outboxdb.Record{}
	for i, r := range rows {
		keys[i] = r.MessageKey
		byKey[r.MessageKey] = r
	}
	return keys, byKey
}

func (b orderingBundle) record(opts outboxdb.RecordOptions, results ...outboxdb.Result) {
	b.t.Helper()
	got, err := outboxdb.RecordResults(b.Ctx, b.Pool, results, opts)
	if err != nil {
		b.t.Fatal(err)
	}
	if len(got) != len(results) {
		b.t.Fatalf("recorded %d of %d results", len(got), len(results))
	}
}

func success(r outboxdb.Record) outboxdb.Result {
	return outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
}

func rejected(r outboxdb.Record) outboxdb.Result {
	return outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusFailed, Sent: true, HTTPStatus: 200,
		PlatformErrcode: "998", Error: "platform errcode 998: do not resend", Class: outboxdb.ClassRejected}
}

// wantHeld checks each message key's row: held (waiting) or not.
func (b orderingBundle) wantHeld(held map[string]bool) {
	b.t.Helper()
	for key, want := range held {
		s := b.State(b.ID(key))
		if s.OrderHeld != want {
			b.t.Errorf("%s: order_held %v, want %v (status %s, key %s)", key, s.OrderHeld, want, s.Status, fixture.Str(s.OrderingKey))
		}
		if want && (s.Status != "PENDING" || s.ClaimToken != nil || s.AttemptCount != 0) {
			b.t.Errorf("%s: held but %s, attempt %d, token %s", key, s.Status, s.AttemptCount, fixture.Str(s.ClaimToken))
		}
	}
}

func TestOrdering(t *testing.T) {
	t.Parallel()
	const berth, other, third = "P1001/B-001", "P1001/B-002", "P1002/B-003"

	t.Run("NewRowWaitsBehindTheHeadOfItsKey", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: berth})
		heartbeat := pendingRec("heartbeat", 3)
		heartbeat.APIType = outboxdb.APITypeHeartbeat
		b.insert(orderedRec("exit", berth, 1), orderedRec("elsewhere", other, 2), heartbeat)
		b.wantHeld(map[string]bool{"exit": true, "elsewhere": false, "heartbeat": false})
		if k := b.State(b.ID("heartbeat")).OrderingKey; k != nil {
			t.Errorf("heartbeat has ordering key %q, want none", *k)
		}
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "elsewhere,heartbeat" {
			t.Errorf("claimed %v, want elsewhere and heartbeat only", keys)
		}
	})

	t.Run("RowsOfOneKeyInABatchFollowBatchOrder", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		// Message keys sort the other way round: batch order decides.
		b.insert(orderedRec("z-enter", berth, 1), orderedRec("m-other", other, 2), orderedRec("a-exit", berth, 3))
		if enter, exit := b.ID("z-enter"), b.ID("a-exit"); enter > exit {
			t.Errorf("enter got id %d, exit %d: ids must follow the batch for one key", enter, exit)
		}
		b.wantHeld(map[string]bool{"z-enter": false, "a-exit": true, "m-other": false})
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "z-enter,m-other" {
			t.Errorf("claimed %v, want z-enter and m-other", keys)
		}
	})

	t.Run("AnEarlierRecordAlreadyStoredDoesNotHold", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(fixture.Row{Key: "delivered", Status: "SUCCESS", OrderingKey: berth})
		// A Kafka redelivery of the delivered event, then a new one.
		b.insert(orderedRec("delivered", berth, 1), orderedRec("next", berth, 2))
		b.wantHeld(map[string]bool{"next": false})
	})

	t.Run("FailedAndKeylessRowsAreNotOrdered", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		bad := orderedRec("bad", berth, 1)
		bad.Status, bad.LastError = outboxdb.StatusFailed, "payload is not JSON"
		b.insert(bad, orderedRec("good", berth, 2))
		if k := b.State(b.ID("bad")).OrderingKey; k != nil {
			t.Errorf("a row FAILED at ingest has ordering key %q, want none", *k)
		}
		b.wantHeld(map[string]bool{"good": false})
	})

	t.Run("ABlockedKeyHoldsNewRows", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: berth, OrderBlocked: true},
			fixture.Row{Key: "failed-skipped", Status: "FAILED", OrderingKey: other})
		b.insert(orderedRec("after-blocked", berth, 1), orderedRec("after-skipped", other, 2))
		b.wantHeld(map[string]bool{"after-blocked": true, "after-skipped": false})
	})

	t.Run("DirectDispatchHandsOverOnlyHeads", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(fixture.Row{Key: "in-flight", Status: "IN_PROGRESS", OrderingKey: berth})
		recs := []outboxdb.NewRecord{
			orderedRec("behind-in-flight", berth, 1), // asked claimed, inserted held
			orderedRec("enter", other, 2),
			orderedRec("exit", other, 3), // behind enter: not asked, the claim goes on to the next
			orderedRec("third", third, 4),
		}
		counts, claimed, err := outboxdb.InsertBatchClaim(b.Ctx, b.Pool, recs, outboxdb.DirectClaim{
			Limit: 3, Lease: time.Minute, Claimer: "me",
		})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range claimed {
			got = append(got, c.MessageKey)
		}
		if strings.Join(got, ",") != "enter,third" {
			t.Errorf("handed over %v, want enter and third (the heads)", got)
		}
		if counts.Pending != 2 {
			t.Errorf("counted %d PENDING rows, want the 2 held ones", counts.Pending)
		}
		b.wantHeld(map[string]bool{"behind-in-flight": true, "exit": true, "enter": false, "third": false})
	})

	t.Run("SuccessReleasesTheNextRow", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("first", berth, 1), orderedRec("second", berth, 2), orderedRec("third", berth, 3))
		conn := listen(t, b.DB)
		keys, rows := b.claimKeys()
		if strings.Join(keys, ",") != "first" {
			t.Fatalf("claimed %v, want first", keys)
		}
		drainNotifications(conn)
		b.record(outboxdb.RecordOptions{}, success(rows["first"]))
		b.wantHeld(map[string]bool{"second": false, "third": true})
		if s := b.State(b.ID("second")); s.DueInMs == nil || *s.DueInMs > 0 {
			t.Errorf("the released row is not due now: %+v", s)
		}
		if err := waitNotification(conn, "released"); err != nil {
			t.Errorf("no notification for the released row: %v", err)
		}
		keys, rows = b.claimKeys()
		if strings.Join(keys, ",") != "second" {
			t.Fatalf("claimed %v, want second", keys)
		}
		b.record(outboxdb.RecordOptions{}, success(rows["second"]))
		if keys, _ = b.claimKeys(); strings.Join(keys, ",") != "third" {
			t.Fatalf("claimed %v, want third", keys)
		}
		if logs := b.Logs(b.ID("second")); len(logs) != 1 || logs[0].Status != "SUCCESS" {
			t.Errorf("a row released by a SUCCESS has logs %+v, want only its own attempt", logs)
		}
	})

	t.Run("ChainedDispatchClaimsTheReleasedRows", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("a1", berth, 1), orderedRec("a2", berth, 2), orderedRec("b1", other, 3), orderedRec("b2", other, 4),
			orderedRec("c1", third, 5), orderedRec("c2", third, 6))
		conn := listen(t, b.DB)
		_, rows := b.claimKeys()
		drainNotifications(conn)
		// Three heads end (one FAILED, skip); room for two chained claims.
		out, err := outboxdb.RecordResultsChained(b.Ctx, b.Pool, []outboxdb.Result{success(rows["a1"]), rejected(rows["b1"]), success(rows["c1"])},
			outboxdb.RecordOptions{Chain: outboxdb.DirectClaim{Limit: 2, Lease: time.Minute, Claimer: "chain"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Recorded) != 3 || len(out.Claimed) != 2 || out.Claimed[0].MessageKey != "a2" || out.Claimed[1].MessageKey != "b2" {
			t.Fatalf("outcome %+v, want 3 recorded and a2, b2 claimed", out)
		}
		recorded := slices.Sorted(slices.Values(out.Recorded))
		if want := []int64{rows["a1"].ID, rows["b1"].ID, rows["c1"].ID}; !slices.Equal(recorded, want) {
			t.Errorf("recorded ids %v, want a1, b1 and c1's %v", recorded, want)
		}
		for _, c := range out.Claimed {
			s := b.State(c.ID)
			if s.Status != "IN_PROGRESS" || s.OrderHeld || s.AttemptCount != 1 || fixture.Str(s.ClaimToken) != c.ClaimToken ||
				fixture.Str(s.ClaimedBy) != "chain" || c.AttemptCount != 1 || len(c.Payload) == 0 || c.LeaseExpiresAt().Before(time.Now().Add(50*time.Second)) {
				t.Errorf("chained row %s: %+v (claim %+v)", c.MessageKey, s, c)
			}
		}
		// The FAILED head's successor says so, once.
		if logs := b.Logs(b.ID("b2")); len(logs) != 1 || logs[0].Status != "ORDER_RELEASED" || logs[0].Attempt != 0 {
			t.Errorf("b2's logs %+v, want one ORDER_RELEASED at attempt 0", logs)
		}
		// The one past the limit is due for any dispatcher, and announced.
		b.wantHeld(map[string]bool{"c2": false})
		if s := b.State(b.ID("c2")); s.Status != "PENDING" {
			t.Errorf("c2 is %s, want PENDING, due", s.Status)
		}
		if err := waitNotification(conn, "released"); err != nil {
			t.Errorf("no notification for the row left due: %v", err)
		}
		// A chained claim is a claim: its result is fenced by its token.
		b.record(outboxdb.RecordOptions{}, success(out.Claimed[0]))
	})

	t.Run("RetriesKeepTheKey", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("enter", berth, 1), orderedRec("exit", berth, 2))
		_, rows := b.claimKeys()
		b.record(outboxdb.RecordOptions{}, outboxdb.Result{ID: rows["enter"].ID, ClaimToken: rows["enter"].ClaimToken,
			Status: outboxdb.StatusPending, RetryIn: 0, Sent: true, HTTPStatus: 500, Error: "http 500"})
		b.wantHeld(map[string]bool{"exit": true})
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "enter" {
			t.Errorf("claimed %v after a retry, want enter again", keys)
		}
	})

	t.Run("FailedHeadWithSkipReleasesTheNextAndSaysSo", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("enter", berth, 1), orderedRec("exit", berth, 2))
		_, rows := b.claimKeys()
		b.record(outboxdb.RecordOptions{OnFailed: outboxdb.OrderSkip}, rejected(rows["enter"]))
		b.wantHeld(map[string]bool{"exit": false})
		if s := b.State(rows["enter"].ID); s.Status != "FAILED" || s.OrderBlocked {
			t.Errorf("the failed head is %s, blocked %v; want FAILED, not blocking", s.Status, s.OrderBlocked)
		}
		logs := b.Logs(b.ID("exit"))
		if len(logs) != 1 || logs[0].Status != "ORDER_RELEASED" || logs[0].Error == nil ||
			!strings.Contains(*logs[0].Error, "row "+strconv.FormatInt(rows["enter"].ID, 10)) ||
			!strings.Contains(*logs[0].Error, "998") {
			t.Errorf("the released row's attempt log is %+v, want one ORDER_RELEASED naming row %d and why it failed", logs, rows["enter"].ID)
		}
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "exit" {
			t.Errorf("claimed %v, want exit", keys)
		}
	})

	t.Run("FailedHeadWithBlockHoldsTheKey", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("enter", berth, 1), orderedRec("exit", berth, 2))
		_, rows := b.claimKeys()
		b.record(outboxdb.RecordOptions{OnFailed: outboxdb.OrderBlock}, rejected(rows["enter"]))
		if s := b.State(rows["enter"].ID); s.Status != "FAILED" || !s.OrderBlocked {
			t.Errorf("the failed head is %s, blocked %v; want FAILED and blocking", s.Status, s.OrderBlocked)
		}
		b.insert(orderedRec("later", berth, 3))
		b.wantHeld(map[string]bool{"exit": true, "later": true})
		if keys, _ := b.claimKeys(); len(keys) != 0 {
			t.Errorf("claimed %v from a blocked key", keys)
		}
	})

	t.Run("ShowSaysWhatAHeldRowWaitsBehind", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("enter", berth, 1), orderedRec("exit", berth, 2), orderedRec("later", berth, 3),
			orderedRec("elsewhere", other, 4))
		_, rows := b.claimKeys()
		show := func(key string) outboxdb.RecordView {
			t.Helper()
			v, err := outboxdb.ShowRecord(b.Ctx, b.Pool, key, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		// The head in flight, then due again after a failure.
		for _, step := range []string{"in flight", "failed once"} {
			if step == "failed once" {
				b.record(outboxdb.RecordOptions{}, outboxdb.Result{ID: rows["enter"].ID, ClaimToken: rows["enter"].ClaimToken,
					Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 500, Error: "http 500", RetryIn: time.Minute})
			}
			for key, before := range map[string]int64{"exit": 0, "later": 1} {
				h := show(key).HeldBehind
				if h == nil || h.ID != rows["enter"].ID || h.MessageKey != "enter" || h.Blocking || h.HeldBefore != before {
					t.Fatalf("%s, head %s: held behind %+v, want row %d (enter) with %d held before", key, step, h, rows["enter"].ID, before)
				}
				if step == "failed once" && (h.Status != outboxdb.StatusPending || fixture.Str(h.LastError) != "http 500" || h.NextRetryAt == nil) {
					t.Errorf("%s: its head after a failure is shown %s, last error %q, next attempt %v", key, h.Status, fixture.Str(h.LastError), h.NextRetryAt)
				}
			}
		}
		for _, key := range []string{"enter", "elsewhere"} {
			if h := show(key).HeldBehind; h != nil {
				t.Errorf("%s is not held, but shown behind row %d", key, h.ID)
			}
		}
		// A FAILED head blocking the key.
		b.ExpireLeases()
		b.MakeDue(rows["enter"].ID)
		_, rows = b.claimKeys()
		b.record(outboxdb.RecordOptions{OnFailed: outboxdb.OrderBlock}, rejected(rows["enter"]))
		if h := show("exit").HeldBehind; h == nil || h.MessageKey != "enter" || !h.Blocking || h.Status != outboxdb.StatusFailed {
			t.Errorf("exit, its head FAILED and blocking: held behind %+v, want the blocking row", h)
		}
	})

	t.Run("ExhaustedHeadFollowsThePolicy", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.insert(orderedRec("a1", berth, 1), orderedRec("a2", berth, 2), orderedRec("b1", other, 3), orderedRec("b2", other, 4))
		b.Exec(`UPDATE forward_deliveries SET attempt_count = 5 WHERE message_key IN ('a1', 'b1')`)
		res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "me", MaxAttempts: 5})
		if len(res.Exhausted) != 2 {
			t.Fatalf("exhausted %+v, want a1 and b1", res.Exhausted)
		}
		for _, e := range res.Exhausted {
			opts := outboxdb.RecordOptions{OnFailed: outboxdb.OrderSkip}
			if e.MessageKey == "a1" {
				opts.OnFailed = outboxdb.OrderBlock
			}
			if _, err := outboxdb.FailExhausted(b.Ctx, b.Pool, []outboxdb.Record{e}, opts); err != nil {
				t.Fatal(err)
			}
		}
		b.wantHeld(map[string]bool{"a2": true, "b2": false})
	})

	t.Run("RequeueKeepsEachKeysOrder", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		ids := b.Insert(
			fixture.Row{Key: "f1", Status: "FAILED", OrderingKey: berth},
			fixture.Row{Key: "x", Status: "IN_PROGRESS", OrderingKey: other}, // a live head
			fixture.Row{Key: "f2", Status: "FAILED", OrderingKey: berth},
			fixture.Row{Key: "f3", Status: "FAILED", OrderingKey: other},
			fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: third, OrderBlocked: true},
			fixture.Row{Key: "f4", Status: "FAILED", OrderingKey: third},
		)
		// One row per batch: each batch sees what the earlier ones did.
		n, err := outboxdb.Requeue(b.Ctx, b.Pool, outboxdb.RequeueFilter{
			Keys: []string{"f1", "f2", "f3", "f4"},
		}, outboxdb.RequeueOptions{BatchSize: 1})
		if err != nil || n != 4 {
			t.Fatalf("requeued %d rows (%v), want 4", n, err)
		}
		b.wantHeld(map[string]bool{"f1": false, "f2": true, "f3": true, "f4": true})
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "f1" {
			t.Fatalf("claimed %v, want f1 only", keys)
		}
		// Requeueing the blocked row makes it the head again.
		if _, err := outboxdb.Requeue(b.Ctx, b.Pool, outboxdb.RequeueFilter{Keys: []string{"blocked"}}, outboxdb.RequeueOptions{}); err != nil {
			t.Fatal(err)
		}
		if s := b.State(ids[4]); s.Status != "PENDING" || s.OrderHeld || s.OrderBlocked || s.FailedAt != nil {
			t.Errorf("the requeued blocked row is %s, held %v, blocked %v, failed at %v; want the head, no longer failed",
				s.Status, s.OrderHeld, s.OrderBlocked, s.FailedAt)
		}
		b.wantHeld(map[string]bool{"f4": true})
		if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "blocked" {
			t.Errorf("claimed %v, want the requeued blocked row", keys)
		}
	})

	t.Run("RequeueInOneBatchHoldsTheLaterRows", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(
			fixture.Row{Key: "f1", Status: "FAILED", OrderingKey: berth},
			fixture.Row{Key: "f2", Status: "FAILED", OrderingKey: berth},
			fixture.Row{Key: "f3", Status: "FAILED", OrderingKey: berth},
		)
		if _, err := outboxdb.Requeue(b.Ctx, b.Pool, outboxdb.RequeueFilter{}, outboxdb.RequeueOptions{}); err != nil {
			t.Fatal(err)
		}
		b.wantHeld(map[string]bool{"f1": false, "f2": true, "f3": true})
		for _, want := range []string{"f1", "f2", "f3"} {
			keys, rows := b.claimKeys()
			if strings.Join(keys, ",") != want {
				t.Fatalf("claimed %v, want %s", keys, want)
			}
			b.record(outboxdb.RecordOptions{}, success(rows[want]))
		}
	})

	t.Run("ReleaseUnblocksTheKey", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		ids := b.Insert(
			fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: berth, OrderBlocked: true, LastError: "platform errcode 998"},
			fixture.Row{Key: "exit", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "enter-again", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "blocked-2", Status: "FAILED", OrderingKey: other, OrderBlocked: true},
			fixture.Row{Key: "other-exit", OrderingKey: other, OrderHeld: true},
		)
		dry, err := outboxdb.ReleaseKey(b.Ctx, b.Pool, outboxdb.ReleaseOptions{Key: berth, Operator: "alice", DryRun: true})
		if err != nil || len(dry.Unblocked) != 1 || dry.Unblocked[0] != ids[0] || dry.Promoted != ids[1] {
			t.Fatalf("dry run: %+v, %v; want row %d unblocked and %d released", dry, err, ids[0], ids[1])
		}
		if s := b.State(ids[0]); !s.OrderBlocked {
			t.Fatal("a dry run changed the blocked row")
		}
		b.wantHeld(map[string]bool{"exit": true})

		got, err := outboxdb.ReleaseKey(b.Ctx, b.Pool, outboxdb.ReleaseOptions{Key: berth, Operator: "alice"})
		if err != nil || got.Promoted != ids[1] {
			t.Fatalf("release: %+v, %v", got, err)
		}
		if s := b.State(ids[0]); s.Status != "FAILED" || s.OrderBlocked {
			t.Errorf("the released row is %s, blocked %v; want FAILED, not blocking", s.Status, s.OrderBlocked)
		}
		b.wantHeld(map[string]bool{"exit": false, "enter-again": true})
		logs := b.Logs(ids[1])
		if len(logs) != 1 || logs[0].Status != "ORDER_RELEASED" || logs[0].Error == nil ||
			!strings.Contains(*logs[0].Error, "alice") || !strings.Contains(*logs[0].Error, strconv.FormatInt(ids[0], 10)) {
			t.Errorf("the promoted row's logs are %+v, want ORDER_RELEASED naming alice and row %d", logs, ids[0])
		}
		var op, action, filter string
		var n int64
		if err := b.Pool.QueryRow(b.Ctx, `SELECT operator, action, filter, rows FROM forward_operator_log`).Scan(&op, &action, &filter, &n); err != nil {
			t.Fatal(err)
		}
		if op != "alice" || action != "release" || !strings.Contains(filter, berth) || n != 1 {
			t.Errorf("audit row %q %q %q %d", op, action, filter, n)
		}
		if _, err := outboxdb.ReleaseKey(b.Ctx, b.Pool, outboxdb.ReleaseOptions{Key: berth, Operator: "alice"}); !errors.Is(err, outboxdb.ErrNotBlocked) {
			t.Errorf("releasing an unblocked key: %v, want ErrNotBlocked", err)
		}
		if _, err := outboxdb.ReleaseKey(b.Ctx, b.Pool, outboxdb.ReleaseOptions{ID: ids[4], Operator: "bob"}); !errors.Is(err, outboxdb.ErrNotBlocked) {
			t.Errorf("releasing by a held row's id: %v, want ErrNotBlocked", err)
		}
		if got, err := outboxdb.ReleaseKey(b.Ctx, b.Pool, outboxdb.ReleaseOptions{ID: ids[3], Operator: "bob"}); err != nil || got.Key != other || got.Promoted != ids[4] {
			t.Errorf("release by id: %+v, %v", got, err)
		}
	})

	t.Run("TheDatabaseRefusesASecondHead", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: berth})
		second := b.Insert(fixture.Row{Key: "second", OrderingKey: berth, OrderHeld: true})[0]
		_, err := b.Pool.Exec(b.Ctx, `UPDATE forward_deliveries SET order_held = false WHERE id = $1`, second)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.ConstraintName != "forward_deliveries_order_head_key" {
			t.Fatalf("making a second head: %v, want a violation of forward_deliveries_order_head_key", err)
		}
		// Held behind it is fine, and so is a head of another key.
		b.Insert(fixture.Row{Key: "held", OrderingKey: berth, OrderHeld: true}, fixture.Row{Key: "other", OrderingKey: other})
	})

	t.Run("RepairReleasesHeldRowsNothingHolds", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		ids := b.Insert(
			fixture.Row{Key: "stranded-1", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "stranded-2", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: other},
			fixture.Row{Key: "waiting", OrderingKey: other, OrderHeld: true},
			fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: third, OrderBlocked: true},
			fixture.Row{Key: "behind-blocked", OrderingKey: third, OrderHeld: true},
		)
		got, err := outboxdb.RepairOrdering(b.Ctx, b.Pool, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != ids[0] || got[0].Key != berth {
			t.Fatalf("repaired %+v, want only row %d", got, ids[0])
		}
		b.wantHeld(map[string]bool{"stranded-1": false, "stranded-2": true, "waiting": true, "behind-blocked": true})
		if logs := b.Logs(ids[0]); len(logs) != 1 || logs[0].Status != "ORDER_RELEASED" {
			t.Errorf("repaired row's logs %+v, want one ORDER_RELEASED", logs)
		}
		if got, err := outboxdb.RepairOrdering(b.Ctx, b.Pool, 0); err != nil || len(got) != 0 {
			t.Errorf("second repair: %+v, %v; want nothing", got, err)
		}
	})

	t.Run("StatsAndGaugesCountHeldRowsAndBlockedKeys", func(t *testing.T) {
		t.Parallel()
		b := setupOrdering(t)
		b.Insert(
			fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: berth, OrderBlocked: true, Age: time.Hour, LastError: "rejected"},
			fixture.Row{Key: "w1", OrderingKey: berth, OrderHeld: true, Age: 2 * time.Minute},
			fixture.Row{Key: "w2", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: other},
			fixture.Row{Key: "w3", OrderingKey: other, OrderHeld: true},
		)
		st, err := outboxdb.ReadStats(b.Ctx, b.Pool, outboxdb.StatsOptions{RequeueRounds: 3})
		if err != nil {
			t.Fatal(err)
		}
		o := st.Ordering
		if o.HeldRows != 3 || o.BlockedKeys != 1 || len(o.Blocked) != 1 || o.Blocked[0].Key != berth ||
			o.Blocked[0].Held != 2 || o.Blocked[0].MessageKey != "blocked" || o.Blocked[0].Age < 59*time.Minute {
			t.Errorf("ordering stats %+v", o)
		}
		if st.Rows[outboxdb.StatusPending] != 3 {
			t.Errorf("%d PENDING rows, want the 3 held ones", st.Rows[outboxdb.StatusPending])
		}
		g, err := outboxdb.ReadRecordGauges(b.Ctx, b.Pool, outboxdb.GaugeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if g.OrderHeld != 3 || g.OrderBlockedKeys != 1 || g.Pending != 3 || g.OldestHeldAge < 119*time.Second || g.OldestHeldAge > time.Hour ||
			g.OldestBlockedAge < 59*time.Minute || g.OldestBlockedAge > 2*time.Hour {
			t.Errorf("gauges %+v: want 3 held (all PENDING), 1 blocked key for about an hour, the oldest held about 2 minutes", g)
		}
	})
}

// listen opens a connection listening on the dispatchers' channel.
func listen(t *testing.T, db *fixture.DB) *pgx.Conn {
	t.Helper()
	return pgtest.Listen(t, db.Pool, outboxdb.NotifyChannel)
}

func drainNotifications(conn *pgx.Conn) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			return
		}
	}
}

func waitNotification(conn *pgx.Conn, payload string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == payload {
			return nil
		}
	}
}

// stranded counts held rows whose key nothing holds: no head, no blocked
// row. The lock protocol must keep it at 0.
func stranded(t *testing.T, db *fixture.DB) int {
	t.Helper()
	return db.Count(`order_held AND NOT EXISTS (
		SELECT 1 FROM forward_records o WHERE o.ordering_key = forward_records.ordering_key
		  AND ((o.status IN ('PENDING', 'IN_PROGRESS') AND NOT o.order_held) OR o.order_blocked))`)
}

// lockWaiters counts the backends of this database waiting for an
// advisory lock.
func lockWaiters(t *testing.T, db *fixture.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(db.Ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitLockWaiter waits until some backend waits for an advisory lock.
func waitLockWaiter(t *testing.T, db *fixture.DB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if lockWaiters(t, db) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody waited for the ordering key lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOrderLockSerialisesInsertAndResult replays the race the key lock
// exists for, step by step: an insert of a key's next row, whose
// transaction has not committed yet, and the result write that finishes the
// key's head. With the lock the result write waits for the insert, then
// sees its row and releases it. Without it (the same statements, locks left
// out) the result write does not see the uncommitted row, releases nothing,
// and the row stays held with no head: stranded for good. Not parallel: the
// second half switches the locks off for the package.
func TestOrderLockSerialisesInsertAndResult(t *testing.T) {
	const key = "P1/B1"
	scenario := func(t *testing.T, b orderingBundle) {
		b.insert(orderedRec("head", key, 1))
		_, rows := b.claimKeys()
		tx, err := b.Pool.Begin(b.Ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(b.Ctx) }()
		if _, err := outboxdb.InsertBatchCount(b.Ctx, tx, []outboxdb.NewRecord{orderedRec("next", key, 2)}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{success(rows["head"])}, outboxdb.RecordOptions{})
			done <- err
		}()
		var finished bool
		var recordErr error
		for deadline := time.Now().Add(30 * time.Second); !finished; {
			select {
			case recordErr = <-done:
				finished = true
				t.Log("the result write finished while the insert was uncommitted")
			case <-time.After(10 * time.Millisecond):
			}
			if !finished && lockWaiters(t, b.DB) > 0 {
				t.Log("the result write waits for the insert's key lock")
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the result write neither finished nor waited for a lock")
			}
		}
		if err := tx.Commit(b.Ctx); err != nil {
			t.Fatal(err)
		}
		if !finished {
			recordErr = <-done
		}
		if recordErr != nil {
			t.Fatal(recordErr)
		}
	}

	t.Run("WithTheLock", func(t *testing.T) {
		b := setupOrdering(t)
		scenario(t, b)
		b.wantHeld(map[string]bool{"next": false})
		if n := stranded(t, b.DB); n != 0 {
			t.Errorf("%d held rows have no head", n)
		}
	})

	t.Run("WithoutTheLockTheRowIsStranded", func(t *testing.T) {
		restore := outboxdb.SkipOrderLocks()
		defer restore()
		b := setupOrdering(t)
		scenario(t, b)
		if n := stranded(t, b.DB); n != 1 {
			t.Errorf("without the lock %d held rows have no head, want the 1 this test expects", n)
		}
	})
}

// TestOrderLockMustBeItsOwnStatement shows why the lock is a statement of
// its own: a statement that takes the same lock inside itself waits for it
// just as long, but reads the snapshot it took when it started, before the
// lock holder committed, and so misses the row the holder inserted.
func TestOrderLockMustBeItsOwnStatement(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	const key = "P1/B1"
	b.insert(orderedRec("head", key, 1))
	tx, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.Ctx) }()
	if _, err := outboxdb.InsertBatchCount(b.Ctx, tx, []outboxdb.NewRecord{orderedRec("next", key, 2)}); err != nil {
		t.Fatal(err)
	}
	type counts struct{ inside, after int }
	done := make(chan counts, 1)
	go func() {
		var c counts
		ctx := context.Background()
		conn, err := b.Pool.Acquire(ctx)
		if err != nil {
			done <- counts{-1, -1}
			return
		}
		defer conn.Release()
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// The lock inside the statement that reads the key's rows.
			// The subquery runs once the lock's row exists, after the wait.
			if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM forward_records WHERE ordering_key = $1)
				FROM (SELECT pg_advisory_xact_lock(1869767787, hashtext($1))) AS l`, key).Scan(&c.inside); err != nil {
				return err
			}
			// The next statement, under the same lock, sees the row.
			return tx.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE ordering_key = $1`, key).Scan(&c.after)
		})
		if err != nil {
			c = counts{-1, -1}
		}
		done <- c
	}()
	waitLockWaiter(t, b.DB)
	if err := tx.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	c := <-done
	if c.inside != 1 || c.after != 2 {
		t.Errorf("the statement that took the lock itself saw %d rows of the key, the next statement %d; want 1 (the snapshot predates the lock) and 2", c.inside, c.after)
	}
}

// TestOrderingUnderConcurrency races, many times over, the insert of a
// key's next row against the result write that finishes the key's head,
// and the inserts of two batches of one key against each other, on
// separate connections: no row may end held with no head, and no key may
// have two heads (the unique index would refuse it: an error here).
func TestOrderingUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	const rounds = 150
	for i := range rounds {
		key := fmt.Sprintf("P%d/B1", i)
		b.insert(orderedRec(fmt.Sprintf("head-%d", i), key, int64(i)))
	}
	claimed := b.ClaimN(rounds)
	if len(claimed) != rounds {
		t.Fatalf("claimed %d heads, want %d", len(claimed), rounds)
	}
	errs := make(chan error, 3*rounds)
	for i, head := range claimed {
		key := fmt.Sprintf("P%s/B1", strings.TrimPrefix(head.MessageKey, "head-"))
		start := make(chan struct{})
		go func() {
			<-start
			_, err := outboxdb.InsertBatchCount(b.Ctx, b.Pool, []outboxdb.NewRecord{orderedRec(fmt.Sprintf("next-%d", i), key, 1000+int64(i))})
			errs <- err
		}()
		go func() {
			<-start
			_, err := outboxdb.InsertBatchCount(b.Ctx, b.Pool, []outboxdb.NewRecord{orderedRec(fmt.Sprintf("later-%d", i), key, 2000+int64(i))})
			errs <- err
		}()
		go func() {
			<-start
			_, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{success(head)}, outboxdb.RecordOptions{})
			errs <- err
		}()
		close(start)
	}
	for range 3 * rounds {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := stranded(t, b.DB); n != 0 {
		t.Errorf("%d held rows have no head", n)
	}
	if n := b.Count(`status = 'PENDING' AND NOT order_held`); n != rounds {
		t.Errorf("%d heads, want one per key (%d)", n, rounds)
	}
}

// countingConn counts the client's turns: a write that follows a read
// that returned data starts a new round trip. The read is marked when it
// returns, not when it starts: pgx starts a background read while a write
// is slow, and that read can begin before the client's last write and
// return the whole reply after it; marked at its start, the last write
// would clear the mark and the next statement's write would go uncounted.
type countingConn struct {
	net.Conn
	mu        sync.Mutex
	answered  bool
	roundTrip int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.answered = true
		c.mu.Unlock()
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.answered || c.roundTrip == 0 {
		c.roundTrip++
	}
	c.answered = false
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) turns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roundTrip
}

// TestOrderLockCostsNoRoundTrip: a result write that locks ordering keys
// sends the lock and its own statement in one pipeline, a single round trip
// once the statements are prepared, and so does an insert.
func TestOrderLockCostsNoRoundTrip(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	cfg := b.Pool.Config().ConnConfig.Copy()
	var counted *countingConn
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		counted = &countingConn{Conn: c}
		return counted, nil
	}
	conn, err := pgx.ConnectConfig(b.Ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.Ctx)
	for i := range 3 {
		key := fmt.Sprintf("P1/B%d", i)
		before := counted.turns()
		if _, err := outboxdb.InsertBatchCount(b.Ctx, conn, []outboxdb.NewRecord{
			orderedRec(fmt.Sprintf("a-%d", i), key, 1), orderedRec(fmt.Sprintf("b-%d", i), key, 2)}); err != nil {
			t.Fatal(err)
		}
		insertTurns := counted.turns() - before
		// The head, and the row the previous run released.
		claimed, err := outboxdb.Claim(b.Ctx, conn, 10, time.Minute, "me")
		if err != nil || len(claimed) != min(i+1, 2) {
			t.Fatalf("claimed %d rows (%v), want %d", len(claimed), err, min(i+1, 2))
		}
		results := make([]outboxdb.Result, len(claimed))
		for j, c := range claimed {
			results[j] = success(c)
		}
		before = counted.turns()
		if _, err := outboxdb.RecordResults(b.Ctx, conn, results, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		recordTurns := counted.turns() - before
		b.wantHeld(map[string]bool{fmt.Sprintf("b-%d", i): false})
		t.Logf("run %d: insert %d round trips, result write %d", i, insertTurns, recordTurns)
		if i > 0 && (insertTurns != 1 || recordTurns != 1) {
			t.Errorf("run %d with prepared statements: insert took %d round trips, result write %d; want 1 each", i, insertTurns, recordTurns)
		}
	}
}

// TestCompensationKeepsOrdering: a row requeued by automatic compensation
// waits behind its key's head like a requeued one, and a blocked row it
// requeues becomes its key's head again.
func TestCompensationKeepsOrdering(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	ids := b.Insert(
		fixture.Row{Key: "failed", Status: "FAILED", OrderingKey: "P1/B1", Attempts: 5, Age: time.Hour},
		fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: "P1/B1"},
		fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: "P1/B2", OrderBlocked: true, Attempts: 5, Age: time.Hour},
		fixture.Row{Key: "behind-blocked", OrderingKey: "P1/B2", OrderHeld: true},
	)
	if n, err := outboxdb.Compensate(b.Ctx, b.Pool, 3, 30*time.Minute, 100); err != nil || n != 2 {
		t.Fatalf("compensated %d (%v), want 2", n, err)
	}
	b.wantHeld(map[string]bool{"failed": true, "blocked": false, "behind-blocked": true})
	if s := b.State(ids[2]); s.Status != "PENDING" || s.OrderBlocked {
		t.Errorf("the compensated blocked row: %+v", s)
	}
	if keys, _ := b.claimKeys(); strings.Join(keys, ",") != "blocked" {
		t.Errorf("claimed %v, want only the compensated blocked row", keys)
	}
}

// TestOrderingPlans: the ordering probes of the insert and of the result
// write read one key's entries of forward_deliveries_order_idx (and the
// message_key index), one probe per row, even with 20 000 due unordered
// rows and a held backlog in the statistics, and for the result write in
// the plan a statement prepared once is given (generic) as well as in the
// one it gets at once: never every PENDING row through the status index per
// finished row, which made a result write that released 150 rows 15 times
// slower.
func TestOrderingPlans(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	b.InsertDue("backlog", 20_000)
	b.Exec(`UPDATE forward_deliveries SET next_retry_at = now() + interval '1 hour'`) // due later: not claimed here
	b.InsertHeld("P0/B0", 2_000)
	// The pool the components share has enable_seqscan off (see
	// outboxdb.PoolConfig.NoSeqScan): plans are read as it makes them.
	pool, err := outboxdb.Open(b.Ctx, b.Pool.Config().ConnString(), outboxdb.PoolConfig{NoSeqScan: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	recs := make([]outboxdb.NewRecord, 300)
	for i := range recs {
		recs[i] = orderedRec(fmt.Sprintf("r-%d", i), fmt.Sprintf("P1/B%d", i%150), int64(i))
	}
	b.Exec("ANALYZE forward_messages, forward_deliveries")
	explain := func(generic bool, sql string, args ...any) string {
		t.Helper()
		tx, err := pool.Begin(b.Ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(b.Ctx) }()
		if generic { // as a statement prepared once and run many times is
			if _, err := tx.Exec(b.Ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
				t.Fatal(err)
			}
		}
		if sql == outboxdb.InsertSQL() { // the keys it may hold rows of are locked first
			if _, err := tx.Exec(b.Ctx, outboxdb.OrderLockActiveSQL(), args[14]); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := tx.Query(b.Ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}

	// The insert: 300 rows of 150 keys.
	keys, statuses, empty := make([]string, len(recs)), make([]string, len(recs)), make([]string, len(recs))
	okeys, msgKeys := make([]string, len(recs)), make([]string, len(recs))
	payloads, kafkaKeys := make([][]byte, len(recs)), make([][]byte, len(recs))
	parts, offsets, types, topics := make([]int32, len(recs)), make([]int64, len(recs)), make([]string, len(recs)), make([]string, len(recs))
	for i, r := range recs {
		msgKeys[i], statuses[i], okeys[i], payloads[i], types[i], topics[i], offsets[i] = r.MessageKey, "PENDING", r.OrderingKey, r.Payload, r.APIType, r.KafkaTopic, r.KafkaOffset
		keys[i] = r.MessageKey
	}
	plan := explain(false, outboxdb.InsertSQL(), msgKeys, types, topics, parts, offsets, kafkaKeys, payloads, statuses, empty,
		empty, empty, empty, empty, empty, okeys, outboxdb.NotifyChannel, int64(60000), "me", false, empty)
	for _, want := range []string{"Index Only Scan using forward_deliveries_order_idx", "_message_key_idx on forward_messages_p"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the insert's probes do not use %q:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan on \"forward_messages_p") {
		t.Errorf("the insert's dedupe probe reads a partition sequentially:\n%s", plan)
	}

	// The result write of 150 heads, each releasing the row behind it.
	b.insert(recs...)
	claimed := b.ClaimN(1000)
	var heads []outboxdb.Record
	for _, c := range claimed {
		if strings.HasPrefix(c.MessageKey, "r-") {
			heads = append(heads, c)
		}
	}
	if len(heads) != 150 {
		t.Fatalf("claimed %d heads, want 150", len(heads))
	}
	n := len(heads)
	ids, tokens, sts := make([]int64, n), make([]string, n), make([]string, n)
	for i, c := range heads {
		ids[i], tokens[i], sts[i] = c.ID, c.ClaimToken, "SUCCESS"
	}
	for _, generic := range []bool{false, true} {
		plan = explain(generic, outboxdb.RecordSQL(), ids, tokens, sts, make([]*int64, n), make([]*int32, n), make([]*string, n),
			make([]*string, n), make([]*int32, n), make([]bool, n), make([]*string, n), make([]bool, n),
			outboxdb.MaxLeaseReturns, make([]bool, n), "skip", outboxdb.NotifyChannel, "me", int64(60000), 100)
		if !strings.Contains(plan, "Index Scan using forward_deliveries_order_idx on forward_deliveries h") ||
			strings.Contains(plan, "Rows Removed by Filter: 2") && strings.Contains(plan, "status_idx on forward_deliveries h") {
			t.Errorf("the result write does not find each key's next row through forward_deliveries_order_idx (generic plan %v):\n%s", generic, plan)
		}
		if strings.Contains(plan, "forward_deliveries_status_idx on forward_deliveries h") {
			t.Errorf("the result write reads every PENDING row to find a key's next row (generic plan %v):\n%s", generic, plan)
		}
	}
}

// TestInsertLocksOnlyKeysItMayHold: an insert locks the ordering keys that
// have an active row (or several records in its batch), not the others, so
// a result write finishing some key never makes the insert of a new key
// wait; and the insert refuses to hold a row behind a key it did not lock
// (an active row that appeared after it chose its locks).
func TestInsertLocksOnlyKeysItMayHold(t *testing.T) {
	t.Parallel()
	b := setupOrdering(t)
	b.insert(orderedRec("head", "P1/B1", 1))

	// Another transaction holds both keys' locks, as a result write would.
	tx, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.Ctx) }()
	if _, err := tx.Exec(b.Ctx, `SELECT pg_advisory_xact_lock(1869767787, hashtext('P1/B1')),
		pg_advisory_xact_lock(1869767787, hashtext('P2/B2'))`); err != nil {
		t.Fatal(err)
	}
	// A new key: no wait.
	if _, err := outboxdb.InsertBatchCount(b.Ctx, b.Pool, []outboxdb.NewRecord{orderedRec("new-key", "P2/B2", 2)}); err != nil {
		t.Fatal(err)
	}
	// A key with an active row: waits for the lock.
	done := make(chan error, 1)
	go func() {
		_, err := outboxdb.InsertBatchCount(b.Ctx, b.Pool, []outboxdb.NewRecord{orderedRec("behind-head", "P1/B1", 3)})
		done <- err
	}()
	waitLockWaiter(t, b.DB)
	select {
	case err := <-done:
		t.Fatalf("the insert behind an active row did not wait for its key's lock (%v)", err)
	default:
	}
	if err := tx.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.wantHeld(map[string]bool{"new-key": false, "behind-head": true})

	// The guard: a key with no active row when the locks were chosen, and
	// one when the insert reads it.
	conn, err := b.Pool.Acquire(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	gtx, err := conn.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gtx.Rollback(b.Ctx) }()
	if _, err := gtx.Exec(b.Ctx, outboxdb.OrderLockActiveSQL(), []string{"P3/B3"}); err != nil {
		t.Fatal(err)
	}
	b.Insert(fixture.Row{Key: "appeared", Status: "IN_PROGRESS", OrderingKey: "P3/B3"})
	r := orderedRec("late", "P3/B3", 4)
	one := []string{""}
	_, err = gtx.Exec(b.Ctx, outboxdb.InsertSQL(), []string{r.MessageKey}, []string{r.APIType}, []string{r.KafkaTopic},
		[]int32{0}, []int64{4}, [][]byte{nil}, [][]byte{r.Payload}, []string{"PENDING"}, one, one, one, one, one, one,
		[]string{"P3/B3"}, outboxdb.NotifyChannel, int64(60000), "me", false, one)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("holding a row of a key not locked: %v, want serialization_failure", err)
	}
}
