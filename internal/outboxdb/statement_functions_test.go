package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// sentSQL records the statements a pool sends, alone or in batches.
type sentSQL struct {
	mu  sync.Mutex
	sql []string
}

func (s *sentSQL) add(sql string) {
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	s.mu.Unlock()
}

func (s *sentSQL) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(d.SQL)
	return ctx
}
func (s *sentSQL) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *sentSQL) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *sentSQL) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add(d.SQL)
}
func (s *sentSQL) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// starting counts the statements sent that start with prefix.
func (s *sentSQL) starting(prefix string) int {
	return s.matching(regexp.MustCompile("^" + regexp.QuoteMeta(prefix)))
}

// calls counts the statements sent that call the function of statement
// name (outboxdb.MakeStatementFunctions), or any statement function when
// name is empty.
func (s *sentSQL) calls(name string) int {
	if name == "" {
		return s.matching(regexp.MustCompile(`^SELECT \* FROM "forward_stmt_`))
	}
	return s.matching(regexp.MustCompile(`^SELECT \* FROM "forward_stmt_` + name + `_[0-9a-f]{12}"\(`))
}

func (s *sentSQL) matching(re *regexp.Regexp) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.sql {
		if re.MatchString(q) {
			n++
		}
	}
	return n
}

// deliverPooled inserts ordered records claimed through a pooled pool (as
// behind PgBouncer) and records their success, returning the statements it
// sent; every row must end delivered.
func deliverPooled(t *testing.T, dsn string, useFunctions bool) (*sentSQL, int) {
	t.Helper()
	ctx := context.Background()
	pool, sent := pooledPool(t, dsn)
	var err error
	missing := -1
	if useFunctions {
		if missing, err = outboxdb.UseStatementFunctions(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	recs := make([]outboxdb.NewRecord, 20)
	for i := range recs {
		recs[i] = outboxdb.NewRecord{
			MessageKey: fmt.Sprintf("pooled-%d", i), APIType: outboxdb.APITypeVehicleEvent,
			KafkaTopic: "vehicle", KafkaOffset: int64(i), Payload: []byte(`{}`), Status: outboxdb.StatusPending,
			// Two rows a berth: the second is held behind the first.
			OrderingKey: fmt.Sprintf("berth-%d", i/2),
		}
	}
	claim := outboxdb.DirectClaim{Limit: len(recs), Lease: time.Minute, Claimer: "pooled-test"}
	db := fixture.New(t, pool)
	for round := 0; round == 0 || db.Count("status <> 'SUCCESS'") > 0; round++ {
		var claimed []outboxdb.Record
		if round == 0 {
			if _, claimed, err = outboxdb.InsertBatchClaim(ctx, pool, recs, claim); err != nil {
				t.Fatal(err)
			}
		} else {
			res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: len(recs), Lease: time.Minute, Claimer: "pooled-test", MaxAttempts: 5})
			if err != nil {
				t.Fatal(err)
			}
			claimed = res.Claimed
		}
		if round > 3 {
			t.Fatalf("rows undelivered after %d rounds: %d", round, db.Count("status <> 'SUCCESS'"))
		}
		results := make([]outboxdb.Result, len(claimed))
		for i, r := range claimed {
			results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
		}
		if _, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_retry_logs WHERE result_status = 'SUCCESS'`).Scan(&logged); err != nil {
		t.Fatal(err)
	}
	if logged != len(recs) {
		t.Errorf("%d SUCCESS attempts logged, want %d", logged, len(recs))
	}
	return sent, missing
}

// pooledPool opens a pool on dsn as behind a transaction pooler, recording
// the statements it sends.
func pooledPool(t *testing.T, dsn string) (*pgxpool.Pool, *sentSQL) {
	t.Helper()
	pcfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{Pooled: true, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	sent := &sentSQL{}
	pcfg.ConnConfig.Tracer = sent
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, sent
}

// ownerConn connects to dsn as the schema's owner (the tests' role).
func ownerConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestPooledStatementsRunThroughFunctions: behind a transaction pooler
// the insert's and the result write's statements go through the functions
// `outbox migrate` makes, whose plans the server session keeps, and deliver
// the same; a database without them gets the statements themselves.
func TestPooledStatementsRunThroughFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	conn := ownerConn(t, dsn)
	made, err := outboxdb.MakeStatementFunctions(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if made != 5 {
		t.Errorf("made %d statement functions, want 5", made)
	}
	if again, err := outboxdb.MakeStatementFunctions(ctx, conn); err != nil || again != 0 {
		t.Errorf("making them again made %d (%v), want 0", again, err)
	}

	sent, missing := deliverPooled(t, dsn, true)
	if missing != 0 {
		t.Errorf("%d statement functions missing, want 0", missing)
	}
	for _, name := range []string{"insert", "insert_backstop", "order_lock_active", "record", "order_lock"} {
		if sent.calls(name) == 0 {
			t.Errorf("no call of the function of %s.sql sent; sent: %.80q", name, sent.sql)
		}
	}
	if n := sent.starting("-- Persists one batch"); n != 0 {
		t.Errorf("insert.sql itself sent %d times", n)
	}

	// Without the functions, the statements themselves.
	plain := pgtest.NewDB(t)
	sent, missing = deliverPooled(t, plain, true)
	if missing != 5 {
		t.Errorf("%d statement functions missing in a database without them, want 5", missing)
	}
	if n := sent.calls(""); n != 0 {
		t.Errorf("%d function calls sent to a database without them", n)
	}
	if n := sent.starting("-- Persists one batch"); n == 0 {
		t.Error("insert.sql not sent to a database without its function")
	}
}

// TestDroppedStatementFunctionsFallBackToTheStatements: statement functions
// dropped while a pooled pool uses them (a cleanup of older versions' that
// took this one's too) cost one failed call, which says so; the calls after
// it send the statements themselves and deliver. Without the fallback every
// insert failed until the instance restarted: Kafka consumption stopped.
func TestDroppedStatementFunctionsFallBackToTheStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	owner := ownerConn(t, dsn)
	if made, err := outboxdb.MakeStatementFunctions(ctx, owner); err != nil || made != 5 {
		t.Fatalf("made %d statement functions (%v), want 5", made, err)
	}
	pool, sent := pooledPool(t, dsn)
	if missing, err := outboxdb.UseStatementFunctions(ctx, pool); err != nil || missing != 0 {
		t.Fatalf("%d statement functions missing (%v), want none", missing, err)
	}
	if _, err := owner.Exec(ctx, `DO $$ DECLARE f regprocedure; BEGIN
		FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname LIKE 'forward\_stmt\_%' LOOP
			EXECUTE 'DROP FUNCTION ' || f;
		END LOOP; END $$`); err != nil {
		t.Fatal(err)
	}

	rec := func(i int) []outboxdb.NewRecord {
		return []outboxdb.NewRecord{{MessageKey: fmt.Sprintf("dropped-%d", i), APIType: outboxdb.APITypeVehicleEvent,
			KafkaTopic: "vehicle", KafkaOffset: int64(i), Payload: []byte(`{}`), Status: outboxdb.StatusPending, OrderingKey: "berth-1"}}
	}
	claim := outboxdb.DirectClaim{Limit: 1, Lease: time.Minute, Claimer: "dropped-test"}
	if _, _, err := outboxdb.InsertBatchClaim(ctx, pool, rec(1), claim); !errors.Is(err, outboxdb.ErrStatementFunctionMissing) {
		t.Fatalf("insert through a dropped function: %v, want ErrStatementFunctionMissing", err)
	}
	_, claimed, err := outboxdb.InsertBatchClaim(ctx, pool, rec(1), claim)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("insert after the fallback: %d claimed, %v; want the row, claimed", len(claimed), err)
	}
	if _, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{ID: claimed[0].ID, ClaimToken: claimed[0].ClaimToken,
		Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}}, outboxdb.RecordOptions{}); err != nil {
		t.Fatalf("result write after the fallback: %v", err)
	}
	if db := fixture.New(t, pool); db.Count("status = 'SUCCESS'") != 1 {
		t.Fatalf("%d rows SUCCESS, want the one", db.Count("status = 'SUCCESS'"))
	}
	// The failed call never reached the tracer (its description failed
	// before the batch went); the retry sent insert.sql itself.
	if n := sent.starting("-- Persists one batch"); n != 1 {
		t.Errorf("insert.sql itself sent %d times, want once (the retry)", n)
	}
}

// TestStatementFunctionsNeedNoGrants: the statement functions run with the
// caller's rights, and the service's role, with only its documented grants,
// delivers through them behind a pooler.
func TestStatementFunctionsNeedNoGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewEmptyDB(t)
	owner := openPool(t, dsn)
	migrateTo(t, owner, mustMigrations(t))
	service := pgtest.ServiceRole(t, dsn)
	conn, err := owner.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	made, err := outboxdb.MakeStatementFunctions(ctx, conn.Conn())
	conn.Release()
	if err != nil || made != 5 {
		t.Fatalf("the owner made %d statement functions (%v), want 5", made, err)
	}
	sent, missing := deliverPooled(t, service, true)
	if missing != 0 {
		t.Errorf("the service's role finds %d statement functions missing, want 0", missing)
	}
	if sent.calls("insert") == 0 {
		t.Error("the service's role did not insert through the function")
	}
}
