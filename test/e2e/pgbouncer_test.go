package e2e_test

import (
	"context"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// TestPgBouncerTransactionPooling runs two instances with DATABASE_URL
// pointing at Debian's PgBouncer (1.18: no protocol-level prepared
// statements) in transaction pooling mode and DATABASE_DIRECT_URL at
// PostgreSQL (docs/deployment.md, "PgBouncer"): 5 000 messages, every one
// SUCCESS in one row and delivered once; PgBouncer's SHOW STATS shows it
// carried the transactions and SHOW CLIENTS the instances' connections; no
// prepared-statement error or refused startup parameter in any log; the
// instances' direct sessions make `outbox migrate` see them. Before that, an
// instance without DATABASE_DIRECT_URL is refused at start-up with a message
// naming it, instead of running with a LISTEN that hears nothing. Once the
// work is done, each instance's notice that it is idle, sent through the
// pooler, reaches a LISTEN on PostgreSQL (docs/architecture.md,
// "Notifications"), as the other instance's dispatcher hears it.
func TestPgBouncerTransactionPooling(t *testing.T) {
	scenario(t, heavy, 8*time.Second)
	s := newStack(t, stackOptions{
		faults: mockplatform.Faults{Latency: 2 * time.Millisecond, LatencyJitter: 10 * time.Millisecond},
		// Leases long enough that a loaded machine never lets one run
		// out: a repeat would then be a fault of the pooled statements.
		env: map[string]string{"CLAIM_LEASE": "30s", "FORWARD_TIMEOUT": "5s"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, dbName, pooled := s.startBouncer(ctx)

	t.Run("WithoutTheDirectURLStartUpSaysWhatToSet", func(t *testing.T) {
		p := startProc(t, "forwarder-no-direct", mergeEnv(s.env, map[string]string{"DATABASE_URL": pooled}))
		code, exited := s.awaitExit(p, 2*time.Minute)
		if !exited {
			t.Fatalf("an instance on PgBouncer without DATABASE_DIRECT_URL is still running after 2 minutes:\n%s", p.tail(4000))
		}
		if code == 0 || p.countLines("DATABASE_DIRECT_URL") == 0 || p.countLines("transaction-pooling") == 0 {
			t.Fatalf("exit status %d; want a failure naming DATABASE_DIRECT_URL and the pooler:\n%s", code, p.tail(4000))
		}
		t.Logf("refused: %s", lastLine(p.tail(2000), "DATABASE_DIRECT_URL"))
	})

	s.trackFunctions(ctx, dbName)

	n := load(5_000, 2_000)
	env := map[string]string{"DATABASE_URL": pooled, "DATABASE_DIRECT_URL": s.dsn}
	// Duplicates and messages without a messageId take the insert's
	// other statements (the key conflict check, the probe of reused
	// Kafka coordinates) through the pooler too.
	wait := s.produceAsync(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MissingIDRate: 0.02}), n)
	a := s.start("forwarder-a", env)
	bb := s.start("forwarder-b", env)
	if err := wait(); err != nil {
		t.Fatal(err)
	}

	// While both run: PgBouncer serves their pools, and their sessions on
	// the direct connection (LISTEN) are what `outbox migrate` looks for.
	// An instance opens its pool as it starts, which a loaded machine can
	// make take seconds after the messages were produced.
	var clients []map[string]string
	forwarderClients := 0
	for deadline := time.Now().Add(time.Minute); forwarderClients == 0 && time.Now().Before(deadline); {
		clients = bouncerRows(t, b, "SHOW CLIENTS")
		for _, c := range clients {
			if c["database"] == dbName && c["application_name"] == "forwarder" {
				forwarderClients++
			}
		}
		if forwarderClients == 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if forwarderClients == 0 {
		t.Errorf("SHOW CLIENTS lists no connection of the instances (application_name forwarder) to %s: %v", dbName, clients)
	}
	out, err := runForwarder(t, mergeEnv(s.env, env), "outbox", "migrate", "--dry-run")
	if err != nil || !strings.Contains(out, "running instances:") {
		t.Errorf("outbox migrate --dry-run beside two instances: %v\n%s", err, out)
	}

	s.waitSettled(5 * time.Minute)
	r := s.verify()
	if r.dupDeliveries > 0 {
		t.Errorf("%d messages were delivered more than once:%s", r.dupMessages, s.dupHistory(r))
	}

	// Idle, each dispatcher polls at least every 5 s and says it found
	// nothing, at most once a second: a pg_notify in a transaction
	// PgBouncer hands to a server connection, delivered at its commit.
	if missing := awaitIdleNotices(t, s.dsn, 30*time.Second, a.claimer(), bb.claimer()); len(missing) > 0 {
		t.Errorf("no idle notice of %v came through PgBouncer in 30 s of the instances idling", missing)
	}

	// The statements of the insert and the result write went through the
	// functions the instances made on start (the test's role may change the
	// schema), whose plans the server sessions keep, not planned at each
	// execution.
	calls := statementFunctionCalls(t, s.dsn, func(calls map[string]int64) bool {
		return !slices.Contains(slices.Collect(maps.Values(calls)), 0)
	})
	if len(calls) != 5 {
		t.Errorf("statement functions called: %v, want the 5 of the insert and the result write", calls)
	}
	for fn, n := range calls {
		if n == 0 {
			t.Errorf("statement function %s never called", fn)
		}
	}

	var xacts, queries int64
	for _, st := range bouncerRows(t, b, "SHOW STATS") {
		if st["database"] == dbName {
			xacts, _ = strconv.ParseInt(st["total_xact_count"], 10, 64)
			queries, _ = strconv.ParseInt(st["total_query_count"], 10, 64)
		}
	}
	// Every message is inserted (one statement per batch of at most 300)
	// and recorded (one per batch), and most are claimed: at least two
	// transactions per 300 messages went through PgBouncer.
	if min := int64(2 * n / 300); xacts < min {
		t.Errorf("PgBouncer's SHOW STATS counts %d transactions on %s, want at least %d: the instances did not go through it", xacts, dbName, min)
	}
	for _, p := range []*proc{a, bb} {
		for _, bad := range []string{"prepared statement", "unsupported startup parameter", "SQLSTATE 08P01", "SQLSTATE 26000"} {
			if k := p.countLines(bad); k > 0 {
				t.Errorf("%s logged %q on %d lines:\n%s", p.name, bad, k, p.tail(3000))
			}
		}
	}
	if log := b.Log(); strings.Contains(log, "prepared statement") || strings.Contains(log, "unsupported startup parameter") {
		t.Errorf("PgBouncer logged a prepared-statement or startup-parameter error:\n%s", log)
	}
	t.Logf("through PgBouncer (transaction pooling): %s; SHOW STATS: %d transactions, %d queries; %d client connections of the instances at the peak",
		r, xacts, queries, forwarderClients)
}

// startBouncer starts a PgBouncer in transaction pooling mode in front of
// the stack's PostgreSQL, stopped when the test ends, and returns it, the
// stack's database name and the URL of that database through it.
func (s *stack) startBouncer(ctx context.Context) (b *pgcluster.Bouncer, dbName, pooled string) {
	s.t.Helper()
	u, err := url.Parse(s.dsn)
	if err != nil {
		s.t.Fatal(err)
	}
	serverPort, _ := strconv.Atoi(u.Port())
	dbName = strings.TrimPrefix(u.Path, "/")
	b, err = pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Dir: s.t.TempDir() + "/pgbouncer", ServerPort: serverPort, PoolSize: 10})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(b.Stop)
	return b, dbName, b.DSN(dbName)
}

// trackFunctions makes the sessions of database dbName opened from now on
// count the calls of PL/pgSQL functions: the statement functions'.
func (s *stack) trackFunctions(ctx context.Context, dbName string) {
	s.t.Helper()
	if _, err := s.pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{dbName}.Sanitize()+" SET track_functions = 'pl'"); err != nil {
		s.t.Fatal(err)
	}
}

// awaitIdleNotices listens on PostgreSQL at dsn for the dispatchers' idle
// notices (outboxdb.AnnounceIdle) until each of claimers has sent one or
// wait has passed, and returns the claimers not heard.
func awaitIdleNotices(t *testing.T, dsn string, wait time.Duration, claimers ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to listen for idle notices: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outboxdb.NotifyChannel}.Sanitize()); err != nil {
		t.Fatalf("LISTEN: %v", err)
	}
	missing := map[string]bool{}
	for _, c := range claimers {
		missing[c] = true
	}
	for len(missing) > 0 {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			break
		}
		if claimer, ok := outboxdb.IdleNotice(n.Payload); ok {
			delete(missing, claimer)
		}
	}
	return slices.Sorted(maps.Keys(missing))
}

// bouncerRows runs an admin console command of b and returns its rows as
// column name -> text.
func bouncerRows(t *testing.T, b *pgcluster.Bouncer, command string) []map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.AdminDSN())
	if err != nil {
		t.Fatalf("connecting to PgBouncer's admin console: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, command)
	if err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		// The admin console speaks the simple protocol: every value is text.
		m := map[string]string{}
		for i, f := range rows.FieldDescriptions() {
			m[f.Name] = string(rows.RawValues()[i])
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return out
}

// runForwarder runs bin/forwarder with args and exactly env (plus PATH and
// HOME) from the repository root and returns its combined output.
func runForwarder(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testinputs.Forwarder(t, forwarderBin), args...)
	cmd.Dir = repoRoot
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// mergeEnv is base with over's entries added or replaced.
func mergeEnv(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// lastLine is the last line of text holding substr.
func lastLine(text, substr string) string {
	lines := strings.Split(text, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return lines[i]
		}
	}
	return ""
}

// statementFunctionCalls reads, on PostgreSQL at dsn, how often each
// statement function (outboxdb.MakeStatementFunctions) was called, once
// the sessions' counts have reached the statistics (at most ~10 s after
// their last transaction): when the counts are enough, or after 30 s.
func statementFunctionCalls(t *testing.T, dsn string, enough func(calls map[string]int64) bool) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var calls map[string]int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		rows, err := conn.Query(ctx, `SELECT p.proname::text, coalesce(s.calls, 0)
			FROM pg_proc p LEFT JOIN pg_stat_user_functions s ON s.funcid = p.oid
			WHERE p.proname LIKE 'forward\_stmt\_%'`)
		if err != nil {
			t.Fatal(err)
		}
		calls = map[string]int64{}
		var name string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { calls[name] = n; return nil }); err != nil {
			t.Fatal(err)
		}
		if enough(calls) || time.Now().After(deadline) {
			return calls
		}
	}
}
