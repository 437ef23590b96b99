package outboxdb_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// unboundedReads lists the nodes of an EXPLAIN (FORMAT JSON) plan that
// read table without an index condition: a sequential scan, or an index
// scan that walks the whole index (chosen for its order, or because the
// statistics say the table is empty). Either reads every row the table
// holds, live and dead.
func unboundedReads(t *testing.T, planJSON, table string) []string {
	t.Helper()
	var found []string
	for _, n := range planNodes(t, planJSON) {
		if n.RelationName != table {
			continue
		}
		switch {
		case n.NodeType == "Seq Scan":
			found = append(found, "Seq Scan")
		case (n.NodeType == "Index Scan" || n.NodeType == "Index Only Scan") && n.IndexCond == "":
			found = append(found, fmt.Sprintf("%s using %s without an index condition", n.NodeType, n.IndexName))
		}
	}
	return found
}

// rereadBatches lists the nodes of an EXPLAIN (ANALYZE, FORMAT JSON) plan
// that read a statement's batch (its unnest, or a CTE over it) again for
// each row of another input: a nested loop whose inner side is the batch
// costs rows × batch, a million comparisons for a write of a thousand. A
// one-row CTE read once per row is not one of them.
func rereadBatches(t *testing.T, planJSON string) []string {
	t.Helper()
	var found []string
	for _, n := range planNodes(t, planJSON) {
		if (n.NodeType == "CTE Scan" || n.NodeType == "Function Scan") && n.ActualLoops != nil && *n.ActualLoops > 1 &&
			n.ActualRows+n.RowsRemoved > 1 {
			found = append(found, fmt.Sprintf("%s read %.0f times, %.0f rows each", n.NodeType, *n.ActualLoops, n.ActualRows+n.RowsRemoved))
		}
	}
	return found
}

// lookupRef is a column of a batch's lookup object as EXPLAIN VERBOSE
// names it: the CTE (tokens, outcomes, numbered when referenced more than
// once) and its value, or the whole row.
var lookupRef = regexp.MustCompile(`^(tokens|outcomes)(_[0-9]+)?\.(by_id|\*)$`)

// carriedLookups lists the nodes of an EXPLAIN (VERBOSE, FORMAT JSON) plan
// that pass a batch's lookup object (one jsonb value made from the whole
// batch) along with each row, rather than reading it where it is used: a
// join to the lookup's CTE makes every row of an UPDATE, DELETE or FOR
// UPDATE carry a copy of its whole row (to recheck a row a concurrent
// write changed), so a batch of n rows copies n times a value of n entries
// and, where the rows are sorted, spills them to disk.
func carriedLookups(t *testing.T, planJSON string) []string {
	t.Helper()
	var found []string
	for _, n := range planNodes(t, planJSON) {
		for _, col := range n.Output {
			m := lookupRef.FindStringSubmatch(col)
			// The scan of the lookup's CTE reads its value once: that is
			// the read itself, not a copy.
			if m != nil && (m[3] == "*" || n.NodeType != "CTE Scan") {
				found = append(found, fmt.Sprintf("%s outputs %s", n.NodeType, col))
			}
		}
	}
	return found
}

// planningModes are the two ways a statement is planned: a direct pool's
// prepared statement keeps a generic plan, a pooled connection's is
// planned with its values at each execution.
var planningModes = []struct {
	name    string
	cfg     outboxdb.PoolConfig
	generic bool
}{
	{"direct pool, generic plan", outboxdb.PoolConfig{NoSeqScan: true}, true},
	{"pooled connection, each execution planned", outboxdb.PoolConfig{Pooled: true}, false},
}

// recordSuccessArgs are record.sql's parameters for a SUCCESS result of
// each claimed row (ids and tokens pairwise), no order_on_failed block,
// released rows claimed for "me".
func recordSuccessArgs(ids []int64, tokens []string) []any {
	return recordArgs(ids, tokens, outboxdb.StatusSuccess)
}

// recordArgs are recordSuccessArgs with another status for every result
// (PENDING: a retry due at once).
func recordArgs(ids []int64, tokens []string, status outboxdb.Status) []any {
	n := len(ids)
	statuses := make([]string, n)
	for i := range statuses {
		statuses[i] = string(status)
	}
	return []any{ids, tokens, statuses, make([]*int64, n), make([]*int32, n),
		make([]*string, n), make([]*string, n), make([]*int32, n), make([]bool, n),
		make([]*string, n), make([]bool, n), outboxdb.MaxLeaseReturns, make([]bool, n), "skip", outboxdb.NotifyChannel,
		"me", time.Minute.Milliseconds(), 10}
}

// claims returns the ids and claim tokens of claimed rows, pairwise.
func claims(claimed []outboxdb.Record) (ids []int64, tokens []string) {
	for _, r := range claimed {
		ids, tokens = append(ids, r.ID), append(tokens, r.ClaimToken)
	}
	return ids, tokens
}

// queueLooksEmpty returns a new outbox whose forward_deliveries has the
// statistics autovacuum takes of a queue at a steady rate: many pages, no
// live row.
func queueLooksEmpty(t *testing.T) (dsn string, db *fixture.DB) {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	db = fixture.New(t, pool)
	db.InsertDue("gone", 20000)
	db.Exec(`DELETE FROM forward_deliveries`)
	db.Exec(`ANALYZE forward_deliveries`)
	var pages int
	var tuples float64
	if err := db.Pool.QueryRow(db.Ctx, `SELECT relpages, reltuples FROM pg_class WHERE oid = 'forward_deliveries'::regclass`).Scan(&pages, &tuples); err != nil {
		t.Fatal(err)
	}
	if pages < 100 || tuples > 0 {
		t.Fatalf("the statistics are %d pages and %.0f rows, want many pages and no rows", pages, tuples)
	}
	return dsn, db
}

// TestQueuePlansHoldWhenTheQueueLooksEmpty: forward_deliveries is a queue.
// A delivered row leaves it, so at a steady rate it holds a few dozen live
// rows among thousands of dead ones, and autovacuum, whenever it comes,
// records what it sees: many pages, almost no rows. Planned with those
// statistics, the result write joined its results to the table through a
// walk of the whole primary key (estimated at one row), read every live and
// dead row of the table on each batch, and held its ordering keys' locks
// meanwhile: at 2 000 messages a second the latency grew without bound from
// the first autovacuum on (docs/architecture.md, "A queue's statistics are
// not trusted"). Every statement of the delivery path must reach the table
// by an index condition, whatever the statistics say, in the generic plan a
// direct pool keeps and in the plan a pooled connection makes for each
// execution.
func TestQueuePlansHoldWhenTheQueueLooksEmpty(t *testing.T) {
	t.Parallel()
	dsn, db := queueLooksEmpty(t)
	// What the queue holds then: rows in flight, held rows behind heads.
	db.InsertDue("live", 2000)
	ids, tokens := claims(db.ClaimN(20))
	for i := range 50 {
		db.InsertHeld(fmt.Sprintf("P%d/B1", i), 3)
	}
	messageKeys := []string{"live-1", "live-2", "k1"}

	keys := []string{"P1/B1", "P2/B1"}
	one := []string{""}
	insertArgs := []any{[]string{"k1"}, []string{"VEHICLE_EVENT"}, []string{"t"}, []int32{0}, []int64{1},
		[][]byte{nil}, [][]byte{[]byte("{}")}, []string{"IN_PROGRESS"}, one,
		[]string{"00000000-0000-4000-8000-000000000001"}, one, one, one, one, []string{"P1/B1"},
		outboxdb.NotifyChannel, time.Minute.Milliseconds(), "me", true, one}
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"record", outboxdb.RecordSQL(), recordSuccessArgs(ids, tokens)},
		{"release", outboxdb.ReleaseSQL(), []any{ids, tokens, int64(0), false, "released", outboxdb.NotifyChannel}},
		{"claim", outboxdb.ClaimSQL(), []any{100, time.Minute.Milliseconds(), "me", 5, int64(-1)}},
		{"renew", outboxdb.RenewSQL(), []any{ids, tokens, time.Minute.Milliseconds()}},
		{"renew_settled", outboxdb.RenewSettledSQL(), []any{ids, tokens, "me"}},
		{"order_lock", outboxdb.OrderLockSQL(), []any{keys, ids}},
		{"insert", outboxdb.InsertSQL(), insertArgs},
		{"order_lock_active", outboxdb.StatementSQL("order_lock_active.sql"), []any{keys}},
		{"insert_backstop", outboxdb.StatementSQL("insert_backstop.sql"), []any{messageKeys}},
		{"deadletter_mark", outboxdb.StatementSQL("deadletter_mark.sql"), []any{ids, tokens}},
		{"deadletter_release", outboxdb.StatementSQL("deadletter_release.sql"), []any{ids, tokens, time.Minute.Milliseconds()}},
	}
	for _, st := range statements {
		for _, c := range planningModes {
			plan := explain(t, dsn, c.cfg, c.generic, "FORMAT JSON", st.sql, st.args...)
			if bad := unboundedReads(t, plan, "forward_deliveries"); len(bad) > 0 {
				text := explain(t, dsn, c.cfg, c.generic, "", st.sql, st.args...)
				t.Errorf("%s (%s): reads forward_deliveries without an index condition (%s):\n%s", st.name, c.name, strings.Join(bad, "; "), text)
			}
		}
	}
}

// TestBatchWritesReadEachResultOnce: a backlog makes the result write,
// the renewal and the give-back carry a thousand rows at once, and with
// the statistics of an empty queue none of them may match rows to the
// batch by reading the batch again for each row. Such a result write took
// 0.5-0.95 s for 928 rows (auto_explain: 860 256 rows removed by the
// join's filter), holding its ordering keys' locks meanwhile, and the
// backlog it let grow made the next writes larger still
// (docs/benchmarks.md, "The queue's statistics and the first autovacuum").
// A write of retries (results that change the row rather than delete it)
// is checked too.
//
// Nor may a row carry the batch's lookup: the renewal joined its tokens'
// jsonb to the rows it locked, each of 2 000 rows carried a copy of it
// into a sort that spilled 190 MB to disk, and renewing took 0.55-0.7 s
// where joining the batch had taken 40 ms. A renewal that slow makes an
// instance with a full pipeline miss its renewals' deadline and give
// claims back unsent.
func TestBatchWritesReadEachResultOnce(t *testing.T) {
	t.Parallel()
	dsn, db := queueLooksEmpty(t)
	db.InsertDue("live", 1000)
	claimed := db.ClaimN(1000)
	ids, tokens := claims(claimed)
	deadIDs, deadTokens := deadLetterClaims(t, db, 1000)
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"record", outboxdb.RecordSQL(), recordSuccessArgs(ids, tokens)},
		{"record of retries", outboxdb.RecordSQL(), recordArgs(ids, tokens, outboxdb.StatusPending)},
		{"renew", outboxdb.RenewSQL(), []any{ids, tokens, time.Minute.Milliseconds()}},
		{"release", outboxdb.ReleaseSQL(), []any{ids, tokens, int64(0), false, "released", outboxdb.NotifyChannel}},
		{"renew_settled", outboxdb.RenewSettledSQL(), []any{ids, tokens, "me"}},
		{"insert retried after a lost reply", outboxdb.InsertSQL(), insertRetryArgs(claimed)},
		{"deadletter_mark", outboxdb.StatementSQL("deadletter_mark.sql"), []any{deadIDs, deadTokens}},
		{"deadletter_release", outboxdb.StatementSQL("deadletter_release.sql"), []any{deadIDs, deadTokens, int64(0)}},
	}
	for _, st := range statements {
		for _, c := range planningModes {
			plan := explain(t, dsn, c.cfg, c.generic, "ANALYZE, VERBOSE, FORMAT JSON", st.sql, st.args...)
			if bad := rereadBatches(t, plan); len(bad) > 0 {
				t.Errorf("%s (%s): rereads its batch for each row (%s):\n%s", st.name, c.name, strings.Join(bad, "; "),
					explain(t, dsn, c.cfg, c.generic, "ANALYZE", st.sql, st.args...))
			}
			if bad := carriedLookups(t, plan); len(bad) > 0 {
				t.Errorf("%s (%s): carries the batch's lookup in each row (%s):\n%s", st.name, c.name, strings.Join(bad, "; "),
					explain(t, dsn, c.cfg, c.generic, "ANALYZE, VERBOSE", st.sql, st.args...))
			}
		}
	}
}

// deadLetterClaims inserts n FAILED rows and claims them for the
// dead-letter topic, returning their ids and dead-letter tokens pairwise.
func deadLetterClaims(t *testing.T, db *fixture.DB, n int) (ids []int64, tokens []string) {
	t.Helper()
	rows := make([]fixture.Row, n)
	for i := range rows {
		rows[i] = fixture.Row{Key: fmt.Sprintf("failed-%d", i), Status: "FAILED", Attempts: 5,
			LastHTTPStatus: 200, LastError: "platform errcode 998: do not resend", Payload: []byte("{}")}
	}
	db.Insert(rows...)
	claimed, err := outboxdb.ClaimDeadLetters(db.Ctx, db.Pool, n, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != n {
		t.Fatalf("claimed %d failed rows for the dead-letter topic, want %d", len(claimed), n)
	}
	for _, r := range claimed {
		ref := r.DeadLetterRef()
		ids, tokens = append(ids, ref.ID), append(tokens, ref.Token)
	}
	return ids, tokens
}

// insertRetryArgs are insert.sql's parameters for inserting again, after a
// lost reply, the records of rows already stored and claimed under their
// tokens (direct dispatch): each comes back as recovered.
func insertRetryArgs(claimed []outboxdb.Record) []any {
	n := len(claimed)
	text := func(v string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	keys, tokens := make([]string, n), make([]string, n)
	partitions, offsets := make([]int32, n), make([]int64, n)
	kafkaKeys, payloads := make([][]byte, n), make([][]byte, n)
	for i, r := range claimed {
		keys[i], tokens[i], offsets[i], payloads[i] = r.MessageKey, r.ClaimToken, int64(i), []byte("{}")
	}
	none := text("")
	return []any{keys, text("VEHICLE_EVENT"), text("device-vehicle-event"), partitions, offsets,
		kafkaKeys, payloads, text("IN_PROGRESS"), none, tokens, none, none, none, none, none,
		outboxdb.NotifyChannel, time.Minute.Milliseconds(), "me", true, none}
}
