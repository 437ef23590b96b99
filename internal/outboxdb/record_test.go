package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

type recordTestBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setupRecordTest(t *testing.T) *recordTestBundle {
	t.Helper()
	return &recordTestBundle{ctx: context.Background(), pool: pgtest.NewPool(t)}
}

// claimN inserts n due rows and claims them.
func (b *recordTestBundle) claimN(t *testing.T, n int) []outboxdb.Record {
	t.Helper()
	due := make([]fixture.Row, n)
	for i := range due {
		due[i] = fixture.Row{Key: fmt.Sprintf("%s-%d", t.Name(), i), Offset: int64(i), Payload: []byte("{}")}
	}
	fixture.New(t, b.pool).Insert(due...)
	rows, err := outboxdb.Claim(b.ctx, b.pool, n, time.Minute, "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != n {
		t.Fatalf("claimed %d rows, want %d", len(rows), n)
	}
	return rows
}

type recordRow struct {
	status       string
	attemptCount int
	// retryIn is next_retry_at - updated_at: both are set by the writing
	// statement's now(), so this is the delay it gave the row, exactly,
	// however long ago it ran (nil when next_retry_at is NULL).
	retryIn       *time.Duration
	httpStatus    *int
	lastError     *string
	succeeded     bool
	claimToken    string
	logStatuses   []string
	logErrcodes   []*string
	logAttempts   []int
	logDurationMs []*int
}

func (b *recordTestBundle) row(t *testing.T, id int64) recordRow {
	t.Helper()
	var r recordRow
	var retryMicros *int64
	if err := b.pool.QueryRow(b.ctx, `SELECT status, attempt_count,
			(extract(epoch FROM next_retry_at - updated_at) * 1000000)::bigint, last_http_status, last_error,
			succeeded_at IS NOT NULL, coalesce(claim_token::text, '')
		FROM forward_records WHERE id = $1`, id).
		Scan(&r.status, &r.attemptCount, &retryMicros, &r.httpStatus, &r.lastError, &r.succeeded, &r.claimToken); err != nil {
		t.Fatal(err)
	}
	if retryMicros != nil {
		d := time.Duration(*retryMicros) * time.Microsecond
		r.retryIn = &d
	}
	rows, err := b.pool.Query(b.ctx, `SELECT result_status, platform_errcode, attempt_number, duration_ms
		FROM forward_retry_logs WHERE record_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			s   string
			e   *string
			a   int
			dur *int
		)
		if err := rows.Scan(&s, &e, &a, &dur); err != nil {
			t.Fatal(err)
		}
		r.logStatuses = append(r.logStatuses, s)
		r.logErrcodes = append(r.logErrcodes, e)
		r.logAttempts = append(r.logAttempts, a)
		r.logDurationMs = append(r.logDurationMs, dur)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecordResults(t *testing.T) {
	t.Parallel()

	t.Run("WritesEachStatusAndOneLogRow", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		claimed := b.claimN(t, 3)
		results := []outboxdb.Result{
			{ID: claimed[0].ID, ClaimToken: claimed[0].ClaimToken, Status: outboxdb.StatusSuccess,
				Sent: true, Duration: 12 * time.Millisecond, HTTPStatus: 200},
			{ID: claimed[1].ID, ClaimToken: claimed[1].ClaimToken, Status: outboxdb.StatusFailed,
				Sent: true, Duration: 7 * time.Millisecond, HTTPStatus: 200, PlatformErrcode: "998", Error: "rejected"},
			{ID: claimed[2].ID, ClaimToken: claimed[2].ClaimToken, Status: outboxdb.StatusPending,
				RetryIn: 30 * time.Second, Sent: true, Duration: 3 * time.Millisecond, HTTPStatus: 500, Error: "http 500"},
		}
		recorded, err := outboxdb.RecordResults(b.ctx, b.pool, results, outboxdb.RecordOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(recorded) != 3 {
			t.Fatalf("recorded %v, want all 3 rows", recorded)
		}

		ok := b.row(t, claimed[0].ID)
		if ok.status != "SUCCESS" || !ok.succeeded || ok.retryIn != nil || ok.lastError != nil || *ok.httpStatus != 200 {
			t.Errorf("success row: %+v", ok)
		}
		failed := b.row(t, claimed[1].ID)
		if failed.status != "FAILED" || failed.succeeded || failed.retryIn != nil || *failed.lastError != "rejected" {
			t.Errorf("failed row: %+v", failed)
		}
		pending := b.row(t, claimed[2].ID)
		if pending.status != "PENDING" || pending.retryIn == nil || *pending.httpStatus != 500 {
			t.Fatalf("pending row: %+v", pending)
		}
		if d := *pending.retryIn; d != 30*time.Second {
			t.Errorf("pending row due %v after the write, want 30s", d)
		}

		for i, r := range []recordRow{ok, failed, pending} {
			if len(r.logStatuses) != 1 || r.logStatuses[0] != string(results[i].Status) ||
				r.logAttempts[0] != 1 || r.logDurationMs[0] == nil || *r.logDurationMs[0] != int(results[i].Duration.Milliseconds()) {
				t.Errorf("row %d: log statuses %v attempts %v durations %v", i, r.logStatuses, r.logAttempts, r.logDurationMs)
			}
		}
		if e := failed.logErrcodes[0]; e == nil || *e != "998" {
			t.Errorf("failed row log errcode = %v, want 998", e)
		}
		if ok.logErrcodes[0] != nil {
			t.Errorf("success row log errcode = %v, want NULL", *ok.logErrcodes[0])
		}
	})

	t.Run("StaleClaimTokenChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		first := b.claimN(t, 1)[0]
		// The lease runs out and another dispatcher claims the row again.
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, first.ID); err != nil {
			t.Fatal(err)
		}
		again, err := outboxdb.Claim(b.ctx, b.pool, 1, time.Minute, "other")
		if err != nil || len(again) != 1 || again[0].ClaimToken == first.ClaimToken {
			t.Fatalf("re-claim: %v %v", again, err)
		}
		before := b.row(t, first.ID)

		recorded, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: first.ID, ClaimToken: first.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200},
		}, outboxdb.RecordOptions{})

		if err != nil {
			t.Fatal(err)
		}
		if len(recorded) != 0 {
			t.Fatalf("stale write recorded %v", recorded)
		}
		after := b.row(t, first.ID)
		if after.status != "IN_PROGRESS" || after.claimToken != again[0].ClaimToken || after.succeeded ||
			after.attemptCount != 2 || len(after.logStatuses) != len(before.logStatuses) {
			t.Fatalf("row changed by a stale write: before %+v after %+v", before, after)
		}
		if len(after.logStatuses) != 1 || after.logStatuses[0] != "LEASE_EXPIRED" {
			t.Fatalf("log rows %v, want only the claim's LEASE_EXPIRED", after.logStatuses)
		}
	})

	t.Run("MalformedTokenMatchesNothing", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		c := b.claimN(t, 2)
		recorded, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c[0].ID, ClaimToken: "not-a-uuid", Status: outboxdb.StatusSuccess},
			{ID: c[1].ID, ClaimToken: c[1].ClaimToken, Status: outboxdb.StatusSuccess},
		}, outboxdb.RecordOptions{})

		if err != nil {
			t.Fatal(err)
		}
		if len(recorded) != 1 || recorded[0] != c[1].ID {
			t.Fatalf("recorded %v, want only %d", recorded, c[1].ID)
		}
	})

	t.Run("RepeatedWriteIsANoOp", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		c := b.claimN(t, 1)[0]
		res := []outboxdb.Result{{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusPending, Error: "x"}}
		if got, err := outboxdb.RecordResults(b.ctx, b.pool, res, outboxdb.RecordOptions{}); err != nil || len(got) != 1 {
			t.Fatalf("first write: %v %v", got, err)
		}
		if got, err := outboxdb.RecordResults(b.ctx, b.pool, res, outboxdb.RecordOptions{}); err != nil || len(got) != 0 {
			t.Fatalf("second write: %v %v", got, err)
		}
		r := b.row(t, c.ID)
		if len(r.logStatuses) != 1 || r.retryIn == nil || *r.retryIn != 0 {
			t.Fatalf("row after repeat: %+v", r)
		}
		if r.logDurationMs[0] != nil {
			t.Errorf("unsent attempt has duration %d, want NULL", *r.logDurationMs[0])
		}
	})

	t.Run("UndoneClaimGoesBackUncounted", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		c := b.claimN(t, 1)[0]
		// A first attempt failed and was recorded...
		if _, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 500, Error: "http 500"},
		}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() WHERE id = $1`, c.ID); err != nil {
			t.Fatal(err)
		}
		// ...the second claim is never sent.
		second, err := outboxdb.Claim(b.ctx, b.pool, 1, time.Minute, "test")
		if err != nil || len(second) != 1 || second[0].AttemptCount != 2 {
			t.Fatalf("second claim: %+v %v", second, err)
		}
		recorded, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: second[0].ClaimToken, Status: outboxdb.StatusPending, Undo: true, Error: "not sent"},
		}, outboxdb.RecordOptions{})

		if err != nil || len(recorded) != 1 {
			t.Fatalf("undo: %v %v", recorded, err)
		}
		r := b.row(t, c.ID)
		if r.status != "PENDING" || r.attemptCount != 1 || recordText(r.lastError) != "http 500" || *r.httpStatus != 500 ||
			r.retryIn == nil || *r.retryIn != 0 || len(r.logStatuses) != 1 {
			t.Fatalf("after undo: %+v (last_error %q)", r, recordText(r.lastError))
		}
		if _, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusFailed, Undo: true},
		}, outboxdb.RecordOptions{}); err == nil {
			t.Error("an undone FAILED result was accepted")
		}
	})

	t.Run("StoresUnstorableErrorTextCleaned", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		c := b.claimN(t, 1)[0]
		msg := "bad\x00bytes\xff" + strings.Repeat("é", outboxdb.MaxErrorLen)
		if _, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusFailed, Error: msg},
		}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		r := b.row(t, c.ID)
		if r.lastError == nil || len(*r.lastError) > outboxdb.MaxErrorLen ||
			!strings.HasPrefix(*r.lastError, "bad\uFFFDbytes\uFFFD") || !strings.HasSuffix(*r.lastError, "é…") {
			t.Fatalf("last_error = %q", *r.lastError)
		}
	})

	t.Run("RejectsBadInput", func(t *testing.T) {
		t.Parallel()
		b := setupRecordTest(t)
		c := b.claimN(t, 1)[0]
		if _, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusInProgress},
		}, outboxdb.RecordOptions{}); err == nil || !strings.Contains(err.Error(), "IN_PROGRESS") {
			t.Errorf("IN_PROGRESS result: err = %v", err)
		}
		if _, err := outboxdb.RecordResults(b.ctx, b.pool, []outboxdb.Result{
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusFailed},
			{ID: c.ID, ClaimToken: c.ClaimToken, Status: outboxdb.StatusFailed},
		}, outboxdb.RecordOptions{}); err == nil || !strings.Contains(err.Error(), "twice") {
			t.Errorf("duplicate id: err = %v", err)
		}
		if r := b.row(t, c.ID); r.status != "IN_PROGRESS" || len(r.logStatuses) != 0 {
			t.Errorf("rejected input changed the row: %+v", r)
		}
	})
}

// TestRecordPlan: the result write finds its rows by primary key even when
// the statistics saw no IN_PROGRESS row, so its cost does not grow with the
// number of rows in flight across all instances.
func TestRecordPlan(t *testing.T) {
	t.Parallel()
	b := setupRecordTest(t)
	fixture.New(t, b.pool).InsertFinished(20000)
	if _, err := b.pool.Exec(b.ctx, "ANALYZE forward_messages, forward_deliveries, forward_retry_logs"); err != nil {
		t.Fatal(err)
	}
	// Many rows in flight that the statistics do not know about.
	claimed := b.claimN(t, 2000)[:64]
	n := len(claimed)
	ids, tokens, statuses := make([]int64, n), make([]string, n), make([]string, n)
	for i, c := range claimed {
		ids[i], tokens[i], statuses[i] = c.ID, c.ClaimToken, "SUCCESS"
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	rows, err := tx.Query(b.ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+outboxdb.RecordSQL(), ids, tokens, statuses,
		make([]*int64, n), make([]*int32, n), make([]*string, n), make([]*string, n), make([]*int32, n), make([]bool, n),
		make([]*string, n), make([]bool, n), outboxdb.MaxLeaseReturns, make([]bool, n), "skip", outboxdb.NotifyChannel, "", int64(0), 0)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "on forward_deliveries_pkey") && !strings.Contains(plan.String(), "using forward_deliveries_pkey on forward_deliveries r") ||
		strings.Contains(plan.String(), "forward_deliveries_status_idx") {
		t.Fatalf("result write does not probe by primary key:\n%s", plan.String())
	}
}

func recordText(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func TestCleanText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"short", "short"},
		{"abcdefghi", "abcde…"},                // 5 bytes + 3 for the ellipsis
		{"ab\u00e9\u00e9\u00e9x", "ab\u00e9…"}, // never cut inside a rune
		{"a\x00b", "a\uFFFDb"},
	} {
		if got := outboxdb.CleanText(tc.in, 8); got != tc.want {
			t.Errorf("CleanText(%q, 8) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
