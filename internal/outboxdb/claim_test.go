package outboxdb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func setupClaimTest(t testing.TB) *fixture.DB {
	t.Helper()
	return fixture.New(t, pgtest.NewPool(t))
}

func TestClaimDue(t *testing.T) {
	t.Parallel()

	t.Run("ClaimsDueRowsOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		ids := b.InsertDue("due", 3)
		// Not due yet, finished, and leased to someone else: none is claimed.
		hour, minute := time.Hour, time.Minute
		b.Insert(fixture.Row{Key: "later", APIType: "HEARTBEAT", Payload: []byte{0, 0xff}, DueIn: &hour},
			fixture.Row{Key: "done", APIType: "HEARTBEAT", Payload: []byte{0, 0xff}, Status: "SUCCESS"},
			fixture.Row{Key: "gave-up", APIType: "HEARTBEAT", Payload: []byte{0, 0xff}, Status: "FAILED"},
			fixture.Row{Key: "held", APIType: "HEARTBEAT", Payload: []byte{0, 0xff}, Status: "IN_PROGRESS", DueIn: &minute, ClaimedBy: "other"})
		// Non-UTF-8 payload bytes survive.
		if _, err := b.Pool.Exec(b.Ctx, `UPDATE forward_messages SET payload = '\xff00fe' WHERE id = $1`, ids[1]); err != nil {
			t.Fatal(err)
		}

		res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "claimer-a", MaxAttempts: 5})
		if len(res.Exhausted) != 0 {
			t.Fatalf("exhausted %v, want none", res.Exhausted)
		}
		var got []int64
		tokens := map[string]bool{}
		for _, r := range res.Claimed {
			got = append(got, r.ID)
			tokens[r.ClaimToken] = true
			if r.AttemptCount != 1 || r.ClaimToken == "" || r.APIType != "VEHICLE_EVENT" ||
				r.KafkaTopic != "device-vehicle-event" || r.KafkaPartition != 3 || r.CreatedAt.IsZero() {
				t.Errorf("claimed row %+v", r)
			}
			if r.LeaseExpiresAt().Before(r.CreatedAt.Add(59 * time.Second)) {
				t.Errorf("row %d: lease ends %v, want about a minute after %v", r.ID, r.LeaseExpiresAt(), r.CreatedAt)
			}
			s := b.State(r.ID)
			if s.Status != "IN_PROGRESS" || s.AttemptCount != 1 || s.ClaimToken == nil || *s.ClaimToken != r.ClaimToken ||
				s.ClaimedBy == nil || *s.ClaimedBy != "claimer-a" || s.DueInMs == nil || *s.DueInMs < 50_000 {
				t.Errorf("row %d after claim: %+v", r.ID, s)
			}
		}
		if !slices.Equal(got, ids) {
			t.Fatalf("claimed ids %v, want %v (the due rows, by id)", got, ids)
		}
		if len(tokens) != 3 {
			t.Errorf("claim tokens %v, want 3 distinct", tokens)
		}
		if p := res.Claimed[1].Payload; string(p) != "\xff\x00\xfe" {
			t.Errorf("payload %x, want ff00fe", p)
		}
		if k := res.Claimed[0].KafkaKey; string(k) != "k1" {
			t.Errorf("kafka key %q, want k1", k)
		}
		if n := b.Count("message_key IN ('later', 'done', 'gave-up', 'held') AND attempt_count > 0"); n != 0 {
			t.Errorf("%d rows that were not due were claimed", n)
		}
		if again := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "claimer-b", MaxAttempts: 5}); len(again.Claimed) != 0 {
			t.Errorf("second claim took %d rows still leased", len(again.Claimed))
		}
	})

	t.Run("CarriesTheRowsPreviousFailure", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		b.InsertDue("due", 1)
		first := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "a", MaxAttempts: 5}).Claimed[0]
		if first.PreviousFailureAt != nil {
			t.Fatalf("a row never attempted carries a previous failure at %v", *first.PreviousFailureAt)
		}
		// Attempt 1 fails on instance a; the retry is claimed by b, which
		// must learn when (the platform's protection counts it only once a
		// request sent after that was answered).
		dbNow := func() (at time.Time) {
			if err := b.Pool.QueryRow(b.Ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
				t.Fatal(err)
			}
			return at
		}
		before := dbNow()
		if _, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{{ID: first.ID, ClaimToken: first.ClaimToken,
			Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 503, Error: "http 503"}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		after := dbNow()
		retry := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "b", MaxAttempts: 5}).Claimed[0]
		if retry.ID != first.ID || retry.PreviousFailureAt == nil ||
			retry.PreviousFailureAt.Before(before) || retry.PreviousFailureAt.After(after) {
			t.Fatalf("retry of row %d carries previous failure %v, want the result write's time, between %v and %v",
				first.ID, retry.PreviousFailureAt, before, after)
		}
		failed := *retry.PreviousFailureAt

		// A claim given back unsent (the lease too short for a request, the
		// output stopping) was no failure: the next claim carries the same.
		if _, err := outboxdb.ReleaseUnsent(b.Ctx, b.Pool, []outboxdb.ClaimRef{{ID: retry.ID, ClaimToken: retry.ClaimToken}}); err != nil {
			t.Fatal(err)
		}
		again := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "a", MaxAttempts: 5}).Claimed[0]
		if again.PreviousFailureAt == nil || !again.PreviousFailureAt.Equal(failed) {
			t.Fatalf("after an unsent give-back row %d carries previous failure %v, want %v still", again.ID, again.PreviousFailureAt, failed)
		}

		// A give-back whose attempt stands (a nack: the request may have
		// reached the platform) is a failure of its own.
		before = dbNow()
		if _, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{{ID: again.ID, ClaimToken: again.ClaimToken}}, 0, "nacked"); err != nil {
			t.Fatal(err)
		}
		after = dbNow()
		again = b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "a", MaxAttempts: 5}).Claimed[0]
		if again.PreviousFailureAt == nil || again.PreviousFailureAt.Before(before) || again.PreviousFailureAt.After(after) {
			t.Fatalf("after a nack row %d carries previous failure %v, want the give-back's time, between %v and %v", again.ID, again.PreviousFailureAt, before, after)
		}

		// Failed for good, then requeued: the message is new again, whatever
		// error it still shows, so its next failure is weighed as a first
		// one (with one attempt a row, the requeue's time taken for a failure
		// let it count at the start of an outage).
		if _, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{{ID: again.ID, ClaimToken: again.ClaimToken,
			Status: outboxdb.StatusFailed, Sent: true, HTTPStatus: 503, Error: "http 503"}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		if n, err := outboxdb.Requeue(b.Ctx, b.Pool, outboxdb.RequeueFilter{}, outboxdb.RequeueOptions{}); err != nil || n != 1 {
			t.Fatalf("requeued %d rows (err %v), want 1", n, err)
		}
		requeued := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "b", MaxAttempts: 5}).Claimed[0]
		if requeued.ID != first.ID || requeued.PreviousFailureAt != nil {
			t.Fatalf("requeued row %d carries previous failure %v, want none", requeued.ID, requeued.PreviousFailureAt)
		}
		if requeued.LastError == nil || *requeued.LastError != "http 503" {
			t.Fatalf("requeued row %d shows last error %v, want its last attempt's (http 503)", requeued.ID, requeued.LastError)
		}
	})

	t.Run("LimitIsHonoured", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		ids := b.InsertDue("due", 25)
		first := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "a"})
		second := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "a"})
		third := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "a"})
		if len(first.Claimed) != 10 || len(second.Claimed) != 10 || len(third.Claimed) != 5 {
			t.Fatalf("claimed %d, %d, %d rows, want 10, 10, 5", len(first.Claimed), len(second.Claimed), len(third.Claimed))
		}
		if first.Claimed[0].ID != ids[0] || third.Claimed[4].ID != ids[24] {
			t.Errorf("claims not in due order")
		}
	})

	t.Run("ConcurrentClaimersTakeEachRowOnce", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		const rows = 10_000
		b.InsertDue("due", rows)
		var (
			mu   sync.Mutex
			seen = map[int64]int{}
			wg   sync.WaitGroup
			errs = make(chan error, 3)
		)
		for c := range 3 {
			wg.Go(func() {
				for {
					res, err := outboxdb.ClaimDue(b.Ctx, b.Pool, outboxdb.ClaimParams{
						Limit: 100, Lease: time.Minute, Claimer: fmt.Sprintf("claimer-%d", c), MaxAttempts: 5,
					})
					if err != nil {
						errs <- err
						return
					}
					if len(res.Claimed) == 0 {
						return
					}
					mu.Lock()
					for _, r := range res.Claimed {
						seen[r.ID]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if len(seen) != rows {
			t.Fatalf("claimed %d distinct rows, want %d", len(seen), rows)
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("row %d claimed %d times while its lease held", id, n)
			}
		}
		if n := b.Count("status = 'IN_PROGRESS' AND attempt_count = 1"); n != rows {
			t.Fatalf("%d rows IN_PROGRESS with one attempt, want %d", n, rows)
		}
	})

	t.Run("ExpiredLeaseIsClaimedAgain", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		id := b.InsertDue("due", 1)[0]
		stale := b.Claim(outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "vanished", MaxAttempts: 5}).Claimed[0]

		b.ExpireLeases()
		res := b.Claim(outboxdb.ClaimParams{Limit: 5, Lease: time.Minute, Claimer: "rescuer", MaxAttempts: 5})
		if len(res.Claimed) != 1 || res.Claimed[0].ID != id {
			t.Fatalf("claimed %+v, want row %d again", res.Claimed, id)
		}
		fresh := res.Claimed[0]
		if fresh.AttemptCount != 2 || fresh.ClaimToken == stale.ClaimToken {
			t.Fatalf("rescued claim %+v, want attempt 2 and a new token", fresh)
		}
		logs := b.Logs(id)
		if len(logs) != 1 || logs[0].Status != "LEASE_EXPIRED" || logs[0].Attempt != 1 ||
			logs[0].Error == nil || !strings.Contains(*logs[0].Error, "vanished") {
			t.Fatalf("attempt logs %+v, want one LEASE_EXPIRED for attempt 1 naming the vanished holder", logs)
		}

		// The stale holder's fenced write changes nothing.
		n, err := outboxdb.Release(b.Ctx, b.Pool, []outboxdb.ClaimRef{stale.Ref()}, 0, "late nack")
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("stale release changed %d rows, want 0", n)
		}
		s := b.State(id)
		if s.Status != "IN_PROGRESS" || s.AttemptCount != 2 || s.ClaimToken == nil || *s.ClaimToken != fresh.ClaimToken ||
			*s.ClaimedBy != "rescuer" || s.LastError != nil {
			t.Fatalf("row after the stale write: %+v, want the rescuer's claim untouched", s)
		}
		if logs := b.Logs(id); len(logs) != 1 {
			t.Fatalf("stale write logged an attempt: %+v", logs)
		}
	})

	t.Run("CrashingMessageEndsFailed", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		id := b.InsertDue("poison", 1)[0]
		const maxAttempts = 3
		// Every holder crashes: its lease runs out each time.
		for attempt := 1; attempt <= maxAttempts; attempt++ {
			res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: fmt.Sprintf("crash-%d", attempt), MaxAttempts: maxAttempts})
			if len(res.Claimed) != 1 || res.Claimed[0].AttemptCount != attempt {
				t.Fatalf("claim %d: %+v", attempt, res)
			}
			b.ExpireLeases()
		}
		res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "next", MaxAttempts: maxAttempts})
		if len(res.Claimed) != 0 || len(res.Exhausted) != 1 || res.Exhausted[0].ID != id {
			t.Fatalf("claim after the last attempt: %+v, want the row reported exhausted, not sent", res)
		}
		if recorded, err := outboxdb.FailExhausted(b.Ctx, b.Pool, res.Exhausted, outboxdb.RecordOptions{}); err != nil || len(recorded) != 1 {
			t.Fatalf("FailExhausted: %v, %v", recorded, err)
		}
		s := b.State(id)
		if s.Status != "FAILED" || s.AttemptCount != maxAttempts || s.DueInMs != nil ||
			s.LastError == nil || !strings.Contains(*s.LastError, "lease expired") || !strings.Contains(*s.LastError, "crash-3") {
			t.Fatalf("row %+v, want FAILED naming the expired lease", s)
		}
		if res.Exhausted[0].LastErrorText() != *s.LastError {
			t.Errorf("reported %q, row says %q", res.Exhausted[0].LastErrorText(), *s.LastError)
		}
		if class := fixture.Str(b.State(id).FailureClass); class != "TRANSIENT" {
			t.Errorf("failure class %q, want TRANSIENT (compensation may requeue it)", class)
		}
		logs := b.Logs(id)
		if len(logs) != maxAttempts+1 {
			t.Fatalf("logs %+v, want %d LEASE_EXPIRED and the FAILED result", logs, maxAttempts)
		}
		for i, l := range logs[:maxAttempts] {
			if l.Status != "LEASE_EXPIRED" || l.Attempt != i+1 {
				t.Errorf("log %d: %+v", i, l)
			}
		}
		if last := logs[maxAttempts]; last.Status != "FAILED" || last.Attempt != maxAttempts {
			t.Errorf("last log %+v, want FAILED at attempt %d", last, maxAttempts)
		}
		if again := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "x", MaxAttempts: maxAttempts}); len(again.Claimed)+len(again.Exhausted) != 0 {
			t.Errorf("a FAILED row was claimed again: %+v", again)
		}
	})

	t.Run("PendingRowOutOfAttemptsEndsFailed", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		ids := b.InsertDue("nacked", 2)
		if _, err := b.Pool.Exec(b.Ctx, `UPDATE forward_deliveries SET attempt_count = 5, last_error = 'nacked: db down' WHERE id = $1`, ids[0]); err != nil {
			t.Fatal(err)
		}
		res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "a", MaxAttempts: 5})
		if len(res.Claimed) != 1 || res.Claimed[0].ID != ids[1] || len(res.Exhausted) != 1 || res.Exhausted[0].ID != ids[0] {
			t.Fatalf("claim: %+v", res)
		}
		if s := b.State(ids[0]); s.AttemptCount != 5 {
			t.Fatalf("the exhausted row's claim counted an attempt: %+v", s)
		}
		if _, err := outboxdb.FailExhausted(b.Ctx, b.Pool, res.Exhausted, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		s := b.State(ids[0])
		if s.Status != "FAILED" || s.LastError == nil || !strings.Contains(*s.LastError, "attempts exhausted") ||
			!strings.Contains(*s.LastError, "nacked: db down") {
			t.Fatalf("row %+v", s)
		}
		if logs := b.Logs(ids[0]); len(logs) != 1 || logs[0].Status != "FAILED" || logs[0].Attempt != 5 {
			t.Fatalf("logs %+v", logs)
		}
	})

	t.Run("NoAttemptLimitWhenZero", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		id := b.InsertDue("many", 1)[0]
		if _, err := b.Pool.Exec(b.Ctx, `UPDATE forward_deliveries SET attempt_count = 1000 WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		rows, err := outboxdb.Claim(b.Ctx, b.Pool, 1, time.Minute, "a")
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].AttemptCount != 1001 {
			t.Fatalf("claimed %+v, want the row at attempt 1001", rows)
		}
	})

	// The most attempts a row may be given (FORWARD_MAX_ATTEMPTS' largest):
	// a retry is claimed, and a row at that many attempts ends FAILED.
	t.Run("TheMostAttempts", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		ids := b.InsertDue("retry", 1)
		ids = append(ids, b.InsertDue("spent", 1)...)
		b.Exec(`UPDATE forward_deliveries SET attempt_count = 1000 WHERE id = $1`, ids[0])
		b.Exec(`UPDATE forward_deliveries SET attempt_count = $2 WHERE id = $1`, ids[1], outboxdb.MaxAttemptsLimit)
		res := b.Claim(outboxdb.ClaimParams{Limit: 10, Lease: time.Minute, Claimer: "a", MaxAttempts: outboxdb.MaxAttemptsLimit})
		if len(res.Claimed) != 1 || res.Claimed[0].ID != ids[0] || res.Claimed[0].AttemptCount != 1001 ||
			len(res.Exhausted) != 1 || res.Exhausted[0].ID != ids[1] {
			t.Fatalf("claimed %+v, exhausted %+v; want the retry at attempt 1001 and the spent row exhausted", res.Claimed, res.Exhausted)
		}
	})

	t.Run("NextDue", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		if _, ok, err := outboxdb.NextDue(b.Ctx, b.Pool); err != nil || ok {
			t.Fatalf("empty table: ok %v err %v, want nothing due", ok, err)
		}
		hour, ten := time.Hour, 10*time.Minute
		b.Insert(fixture.Row{Key: "a", APIType: "HEARTBEAT", Payload: []byte{}, DueIn: &hour},
			fixture.Row{Key: "b", APIType: "HEARTBEAT", Payload: []byte{}, DueIn: &ten})
		d, ok, err := outboxdb.NextDue(b.Ctx, b.Pool)
		if err != nil || !ok || d <= 9*time.Minute || d > 10*time.Minute {
			t.Fatalf("next due in %v (ok %v, err %v), want about 10 minutes", d, ok, err)
		}
		b.InsertDue("now", 1)
		if d, ok, err := outboxdb.NextDue(b.Ctx, b.Pool); err != nil || !ok || d > 0 {
			t.Fatalf("next due in %v (ok %v, err %v), want due already", d, ok, err)
		}
	})
}

// TestClaimPlanWithMillionFinishedRows shows the claim's cost does not grow
// with finished rows: with 1 M delivered messages (TestLookupPlans's data
// set without its PENDING and FAILED rows) and fresh statistics it still
// walks forward_deliveries_due_idx in order under a Limit, with no sort and no
// sequential scan. NextDue reads the same index.
func TestClaimPlanWithMillionFinishedRows(t *testing.T) {
	t.Parallel()
	b := millionFinished(t)
	b.InsertDue("due", 1000)
	if _, err := b.Pool.Exec(b.Ctx, "ANALYZE forward_deliveries, forward_messages"); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		sql   string
		args  []any
		limit bool
	}{
		{"Claim", outboxdb.ClaimSQL(), []any{500, int64(60_000), "plan", 5, int64(-1)}, true},
		{"ClaimWithByteBudget", outboxdb.ClaimSQL(), []any{500, int64(60_000), "plan", 5, int64(64 << 20)}, true},
		{"NextDue", outboxdb.StatementSQL("next_due.sql"), nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan := explainPlan(t, b.Pool, c.sql, c.args...)
			limit := plan.find(func(n explainNode) bool { return n.NodeType == "Limit" })
			if limit == nil {
				t.Fatalf("no Limit node:\n%s", plan)
			}
			if scan := limit.find(func(n explainNode) bool {
				return (n.NodeType == "Index Scan" || n.NodeType == "Index Only Scan") && n.IndexName == "forward_deliveries_due_idx"
			}); scan == nil {
				t.Fatalf("no scan of forward_deliveries_due_idx under the Limit:\n%s", plan)
			}
			// The byte budget's running total sorts the rows already locked
			// (at most one claim's worth, read from the CTE), never the table.
			if n := plan.find(func(n explainNode) bool {
				return strings.Contains(n.NodeType, "Sort") &&
					(len(n.Plans) != 1 || n.Plans[0].NodeType != "CTE Scan")
			}); n != nil {
				t.Fatalf("plan sorts (%s):\n%s", n.NodeType, plan)
			}
			if n := plan.find(func(n explainNode) bool {
				return n.RelationName == "forward_deliveries" && (n.NodeType == "Seq Scan" || n.NodeType == "Bitmap Heap Scan")
			}); n != nil {
				t.Fatalf("plan reads forward_deliveries with a %s:\n%s", n.NodeType, plan)
			}
			t.Logf("plan:\n%s", plan)
		})
	}
}

// TestClaimReadsOneMessagePartitionPerRow: with 1 M delivered messages
// over 31 daily partitions and fresh statistics, the claim reads each
// claimed row's message from its own partition, by (id, created_at), so that
// PostgreSQL prunes the others at run time. A plan keyed by id alone probes
// every partition for every row: at 10 M rows over 35 partitions the claim
// took 2-3 times as long as on an empty table.
func TestClaimReadsOneMessagePartitionPerRow(t *testing.T) {
	t.Parallel()
	b := millionFinished(t)
	// Statistics from before the backlog came, as between two autovacuums:
	// the planner expects next to no due row.
	if _, err := b.Pool.Exec(b.Ctx, "ANALYZE forward_deliveries, forward_messages"); err != nil {
		t.Fatal(err)
	}
	b.InsertDue("due", 1000)
	plan := explainPlan(t, b.Pool, outboxdb.ClaimSQL(), 500, int64(60_000), "plan", 5, int64(-1))
	var scans int
	var walk func(n explainNode)
	walk = func(n explainNode) {
		if strings.HasPrefix(n.RelationName, "forward_messages_p") {
			scans++
			if cond := n.IndexCond + " " + n.Filter; !strings.Contains(cond, "created_at") {
				t.Errorf("%s on %s by %q: not by the claimed row's created_at, so every partition is probed for every row",
					n.NodeType, n.RelationName, cond)
			}
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan)
	if scans == 0 {
		t.Fatalf("the claim reads no partition of forward_messages:\n%s", plan)
	}
	if t.Failed() {
		t.Logf("plan:\n%s", plan)
	}
}

// millionFinished is a copy of TestLookupPlans's million messages, all
// delivered: its PENDING and FAILED delivery rows are removed (truncated,
// so that the table is as small as one that never held them).
func millionFinished(t *testing.T) *fixture.DB {
	t.Helper()
	b := fixture.New(t, millionPool(t))
	b.Exec("TRUNCATE forward_deliveries")
	return b
}

type explainNode struct {
	NodeType     string        `json:"Node Type"`
	IndexName    string        `json:"Index Name"`
	RelationName string        `json:"Relation Name"`
	IndexCond    string        `json:"Index Cond"`
	Filter       string        `json:"Filter"`
	Plans        []explainNode `json:"Plans"`
}

func (n explainNode) String() string {
	var sb strings.Builder
	var walk func(explainNode, int)
	walk = func(n explainNode, depth int) {
		sb.WriteString(strings.Repeat("  ", depth) + n.NodeType)
		if n.IndexName != "" {
			sb.WriteString(" using " + n.IndexName)
		}
		if n.RelationName != "" {
			sb.WriteString(" on " + n.RelationName)
		}
		sb.WriteString("\n")
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	walk(n, 0)
	return sb.String()
}

func (n explainNode) find(match func(explainNode) bool) *explainNode {
	if match(n) {
		return &n
	}
	for _, c := range n.Plans {
		if found := c.find(match); found != nil {
			return found
		}
	}
	return nil
}

func explainPlan(t testing.TB, q outboxdb.Querier, sql string, args ...any) explainNode {
	t.Helper()
	// EXPLAIN of a data-modifying statement plans it without running it.
	var raw []byte
	if err := q.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var out []struct {
		Plan explainNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	if len(out) != 1 {
		t.Fatalf("explain returned %d plans", len(out))
	}
	return out[0].Plan
}

// TestClaimProbe: the row a probe carries is one whose message is not
// failing on its own, never the same row twice in a row while another is
// due, and found even behind a backlog of older retries.
func TestClaimProbe(t *testing.T) {
	t.Parallel()
	probe := func(t *testing.T, b *fixture.DB) outboxdb.Record {
		t.Helper()
		res := b.Claim(outboxdb.ClaimParams{Probe: true, Lease: time.Minute, Claimer: "prober", MaxAttempts: 5})
		if len(res.Claimed) != 1 {
			t.Fatalf("probe claimed %d rows, want 1", len(res.Claimed))
		}
		return res.Claimed[0]
	}

	t.Run("AMessageNeverAttemptedGoesFirst", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		due := -time.Minute
		var failing []fixture.Row
		for i := range 200 { // a backlog of retries that failed on their own
			failing = append(failing, fixture.Row{Key: fmt.Sprintf("failing-%d", i), Attempts: 2, DueIn: &due, LastError: "http 500", LastHTTPStatus: 500})
		}
		b.Insert(failing...)
		fresh := b.Insert(fixture.Row{Key: "fresh"})[0]
		if r := probe(t, b); r.ID != fresh || r.AttemptCount != 1 {
			t.Fatalf("probe took row %d (attempt %d), want the never attempted row %d behind 200 failing retries", r.ID, r.AttemptCount, fresh)
		}
	})

	// Failed probes count no attempt, so the messages they carried keep
	// attempt_count 0 like a message never sent; having waited longer, they
	// would be probed again, one per interval, before a new message that
	// could tell the platform is up.
	t.Run("AMessageNeverSentGoesBeforeProbesThatFailed", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		due := -time.Minute
		var probed []fixture.Row
		for i := range 5 {
			probed = append(probed, fixture.Row{Key: fmt.Sprintf("probed-%d", i), DueIn: &due,
				LastError: "platform unavailable, attempt not counted: http 500", LastHTTPStatus: 500})
		}
		b.Insert(probed...)
		fresh := b.Insert(fixture.Row{Key: "fresh"})[0]
		if r := probe(t, b); r.ID != fresh {
			t.Fatalf("probe took %q, want the message never sent (row %d) before five whose probes failed", r.MessageKey, fresh)
		}
	})

	// A requeue resets the attempts but keeps the last error (it
	// describes the last attempt until the next one): a requeued message
	// that failed for good goes after a message never sent, and still
	// carries a probe when it is all there is.
	t.Run("ARequeuedFailureGoesAfterANewMessage", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		b.Insert(fixture.Row{Key: "failed", Status: "FAILED", Attempts: 5, LastError: "http 500", LastHTTPStatus: 500})
		if n, err := outboxdb.Requeue(b.Ctx, b.Pool, outboxdb.RequeueFilter{Keys: []string{"failed"}}, outboxdb.RequeueOptions{}); err != nil || n != 1 {
			t.Fatalf("requeue: %d rows, %v", n, err)
		}
		fresh := b.Insert(fixture.Row{Key: "fresh"})[0]
		if r := probe(t, b); r.ID != fresh {
			t.Fatalf("probe took %q, want the message never sent (row %d) before the requeued failure", r.MessageKey, fresh)
		}
		if r := probe(t, b); r.MessageKey != "failed" || r.AttemptCount != 1 {
			t.Fatalf("second probe took %q (attempt %d), want the requeued row, its first attempt since the requeue", r.MessageKey, r.AttemptCount)
		}
	})

	t.Run("NeverTheSameRowTwiceInARow", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		ids := b.InsertDue("due", 2)
		first := probe(t, b)
		// The probe failed: the row goes back, its attempt not counted.
		if _, err := outboxdb.RecordResults(b.Ctx, b.Pool, []outboxdb.Result{{ID: first.ID, ClaimToken: first.ClaimToken,
			Status: outboxdb.StatusPending, Undo: true, Logged: true, Sent: true, Error: "platform unavailable, attempt not counted: http 503"}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		// Due before the other row, as a retry can be.
		b.Exec(`UPDATE forward_deliveries SET next_retry_at = now() - interval '1 hour' WHERE id = $1`, first.ID)
		second := probe(t, b)
		if second.ID == first.ID || !slices.Contains(ids, second.ID) {
			t.Fatalf("second probe took row %d, the first took %d; want the other due row", second.ID, first.ID)
		}
	})

	t.Run("HeldRowsNeverCarryIt", func(t *testing.T) {
		t.Parallel()
		b := setupClaimTest(t)
		b.Insert(fixture.Row{Key: "head", OrderingKey: "P1/B1", Attempts: 3, LastError: "http 500"},
			fixture.Row{Key: "held", OrderingKey: "P1/B1", OrderHeld: true})
		if r := probe(t, b); r.MessageKey != "head" {
			t.Fatalf("probe took %q, want the key's head (held rows are not due)", r.MessageKey)
		}
	})
}
