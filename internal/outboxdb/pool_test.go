package outboxdb_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// genericPlan prepares sql on one connection of a pool opened with cfg, while
// the outbox is empty, and returns the generic plan PostgreSQL would
// keep for it: what a pgx-prepared statement runs after its first
// executions, however much the table grows before the next ANALYZE.
func genericPlan(t *testing.T, dsn string, cfg outboxdb.PoolConfig, sql string, args ...any) string {
	t.Helper()
	return explain(t, dsn, cfg, true, "", sql, args...)
}

// explain returns EXPLAIN's output, with options ("FORMAT JSON", or ""),
// for sql with args, prepared on one session of a pool opened with cfg: the
// generic plan a prepared statement keeps (generic), or the plan of one
// execution with these values (what a pooled connection, which keeps no
// plan, runs).
func explain(t *testing.T, dsn string, cfg outboxdb.PoolConfig, generic bool, options, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	cfg.MaxConns = 1
	pool, err := outboxdb.Open(ctx, dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	mode := "force_custom_plan"
	if generic {
		mode = "force_generic_plan"
	}
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "PREPARE stmt AS "+sql); err != nil {
		t.Fatal(err)
	}
	placeholders := make([]string, len(args))
	for i := range args {
		placeholders[i] = "$" + strconv.Itoa(i+1)
	}
	if options != "" {
		options = "(" + options + ") "
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+options+"EXECUTE stmt("+strings.Join(placeholders, ",")+")",
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// seqScan reports whether plan reads one of the outbox's tables (or a
// partition of one) sequentially.
func seqScan(plan string) bool {
	for _, table := range []string{"forward_deliveries", "forward_messages", "forward_retry_logs"} {
		if strings.Contains(plan, "Seq Scan on "+table) {
			return true
		}
	}
	return false
}

// TestGenericPlansUseIndexes: the result write, the release and the claim
// reach the outbox tables through an index in the plan PostgreSQL keeps for a
// statement prepared on a small table (see PoolConfig.NoSeqScan). This is
// the pool of a direct connection; a Pooled one keeps no prepared
// statement (TestPooledStatementsAreNotPrepared).
func TestGenericPlansUseIndexes(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ids, tokens := []int64{1, 2}, []string{"a", "b"}
	recordArgs := recordSuccessArgs(ids, tokens)
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"record", outboxdb.RecordSQL(), recordArgs},
		{"release", outboxdb.ReleaseSQL(), []any{ids, tokens, int64(0), false, "released", outboxdb.NotifyChannel}},
		{"claim", outboxdb.ClaimSQL(), []any{100, time.Minute.Milliseconds(), "me", 5, int64(-1)}},
		{"renew", outboxdb.RenewSQL(), []any{ids, tokens, time.Minute.Milliseconds()}},
		{"renew_settled", outboxdb.RenewSettledSQL(), []any{ids, tokens, "me"}},
		{"order_lock", outboxdb.OrderLockSQL(), []any{[]string{"P1/B1"}, ids}},
	}
	for _, st := range statements {
		plan := genericPlan(t, dsn, outboxdb.PoolConfig{NoSeqScan: true}, st.sql, st.args...)
		if seqScan(plan) {
			t.Errorf("%s: the generic plan scans a table sequentially:\n%s", st.name, plan)
		}
	}

	// The outbox processor shares the stream's pool (internal/dispatch.Hub),
	// which has the setting too: a retried direct insert still finds its
	// claims by key, and an ordered row finds its key's active rows and
	// whether it is new, one index probe each.
	one := []string{""}
	insertClaimArgs := []any{[]string{"k1"}, []string{"VEHICLE_EVENT"}, []string{"t"}, []int32{0}, []int64{1},
		[][]byte{nil}, [][]byte{[]byte("{}")}, []string{"IN_PROGRESS"}, one,
		[]string{"00000000-0000-4000-8000-000000000001"}, one, one, one, one, []string{"P1/B1"},
		outboxdb.NotifyChannel, time.Minute.Milliseconds(), "me", true, one}
	if plan := genericPlan(t, dsn, outboxdb.PoolConfig{NoSeqScan: true}, outboxdb.InsertSQL(), insertClaimArgs...); seqScan(plan) {
		t.Errorf("insert_claim: the generic plan scans a table sequentially:\n%s", plan)
	}

	// Why the setting exists: without it, the result write's generic plan
	// made on a small table scans the whole table for every batch.
	if plan := genericPlan(t, dsn, outboxdb.PoolConfig{}, outboxdb.RecordSQL(), recordArgs...); !seqScan(plan) {
		t.Logf("note: without NoSeqScan this PostgreSQL plans the result write by index already:\n%s", plan)
	}
}

// TestPooledStatementsAreNotPrepared: a Pooled pool (DATABASE_URL behind
// PgBouncer) leaves no prepared statement on the server however often it
// runs the claim and the result write, so PostgreSQL plans each execution
// with its parameters and never keeps the generic plan NoSeqScan guards
// against; and it sends no enable_seqscan, which PgBouncer would refuse.
// The direct pool, run the same way, does keep them: the check can tell.
func TestPooledStatementsAreNotPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	run := func(cfg outboxdb.PoolConfig) (prepared int, seqscan string) {
		cfg.MaxConns = 1 // one session, the one asked below
		pool, err := outboxdb.Open(ctx, dsn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		tb := fixture.New(t, pool)
		tb.InsertDue(fmt.Sprintf("pooled-%v", cfg.Pooled), 20)
		for range 8 {
			res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: 2, Lease: time.Minute, Claimer: "t", MaxAttempts: 5})
			if err != nil {
				t.Fatal(err)
			}
			results := make([]outboxdb.Result, len(res.Claimed))
			for i, r := range res.Claimed {
				results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
			}
			if _, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&prepared); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&seqscan); err != nil {
			t.Fatal(err)
		}
		return prepared, seqscan
	}
	if prepared, seqscan := run(outboxdb.PoolConfig{Pooled: true, NoSeqScan: true}); prepared != 0 || seqscan != "on" {
		t.Errorf("pooled: %d prepared statements on the server, enable_seqscan %s; want none and on", prepared, seqscan)
	}
	if prepared, seqscan := run(outboxdb.PoolConfig{NoSeqScan: true}); prepared == 0 || seqscan != "off" {
		t.Errorf("direct: %d prepared statements, enable_seqscan %s; want some and off", prepared, seqscan)
	}
}

// TestServiceStatementsAreNotJITCompiled: on the service's pool (NoSeqScan)
// the read of the shared platform state, a sequential scan of one row that
// every instance runs each second, is not JIT-compiled. With enable_seqscan
// off and JIT on, its plan costs above 10^10 and PostgreSQL compiled it at
// every execution (120 ms to 1.7 s a call measured under load). The control
// below shows the JIT section that the check looks for, where this server
// has JIT.
func TestServiceStatementsAreNotJITCompiled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	explain := func(t *testing.T, pool *pgxpool.Pool) string {
		t.Helper()
		var plan string
		if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+outboxdb.PlatformReadSQL()).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 1, NoSeqScan: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var jit string
	if err := pool.QueryRow(ctx, "SHOW jit").Scan(&jit); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Errorf("jit = %s on the service's connections, want off", jit)
	}
	if plan := explain(t, pool); strings.Contains(plan, `"JIT"`) {
		t.Errorf("the platform state read is JIT-compiled on the service's pool:\n%s", plan)
	}

	// The control: the same connection settings with JIT left on.
	cfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{MaxConns: 1, NoSeqScan: true})
	if err != nil {
		t.Fatal(err)
	}
	delete(cfg.ConnConfig.RuntimeParams, "jit")
	control, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer control.Close()
	var available bool
	if err := control.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Log("this PostgreSQL has no JIT provider (or JIT is off server-wide): the control cannot show what the setting prevents")
		return
	}
	if plan := explain(t, control); !strings.Contains(plan, `"JIT"`) {
		t.Errorf("control: with JIT on and sequential scans off the read is not JIT-compiled, so the check above proves nothing:\n%s", plan)
	}
}

// TestTransactionsAreReadCommitted: with serializable set as the default
// for the database by an administrator, claims, inserts and result writes
// failed with serialization errors under load, and with repeatable read
// the insert's second look for a message stored meanwhile saw nothing new.
// The service's connections ask for read committed at start, which
// overrides the database's and the role's defaults; a Pooled one cannot
// (a pooler refuses startup parameters), and start-up checks it instead;
// other pools (the metrics exporter's, which may lead to a pooler the
// service refuses) keep the server's default.
func TestTransactionsAreReadCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin := pgtest.NewDBPool(t)
	pgtest.SetForDatabase(t, admin, "default_transaction_isolation", "serializable")
	for _, c := range []struct {
		cfg  outboxdb.PoolConfig
		want string
	}{
		{outboxdb.PoolConfig{ReadCommitted: true}, outboxdb.ReadCommitted},
		{outboxdb.PoolConfig{ReadCommitted: true, NoSeqScan: true}, outboxdb.ReadCommitted},
		{outboxdb.PoolConfig{}, "serializable"},
		{outboxdb.PoolConfig{ReadCommitted: true, Pooled: true}, "serializable"},
	} {
		pool, err := outboxdb.Open(ctx, dsn, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got)
		pool.Close()
		if err != nil || got != c.want {
			t.Errorf("%+v: transactions at %q (%v), want %q", c.cfg, got, err, c.want)
		}
	}
}
