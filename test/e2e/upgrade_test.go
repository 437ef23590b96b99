package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestRollingUpgradeAcrossTheNewestMigration makes the upgrade `helm
// upgrade` makes (docs/deployment.md, "Upgrades") across the newest
// migration, while messages flow: an instance of the build before that
// migration created the schema and runs; this build's `outbox migrate`
// applies the migration under it; the old instance goes on alone for a
// while (another one of its build, started then, refuses the newer schema);
// a new instance starts beside it, and the old one is stopped with SIGTERM.
// Every migration since schema 5 is online: instances of the version before
// keep running on the new schema. So the old instance delivers and records
// results after the migration (retries among them: the platform fails some
// requests) without a database error or an error in its log, and no message
// is lost, delivered twice or out of its berth's order. Connected directly,
// and behind PgBouncer (transaction pooling), where the old instance goes
// on through the statement functions its version made while the migration
// makes the new version's.
func TestRollingUpgradeAcrossTheNewestMigration(t *testing.T) {
	scenario(t, heavy, 30*time.Second)
	ms := migrations(t)
	if newest := ms[len(ms)-1]; !newest.Online {
		t.Skipf("the newest migration %s is offline: it is applied with every instance stopped (docs/deployment.md, \"Upgrades\"), not during a rollout", newest.Name)
	}
	old, oldVersion := buildBeforeMigration(t, ms[len(ms)-1])
	t.Run("Direct", func(t *testing.T) { rollingUpgrade(t, old, oldVersion, false) })
	t.Run("BehindPgBouncer", func(t *testing.T) { rollingUpgrade(t, old, oldVersion, true) })
}

// TestRollingUpgradeAcrossEveryOnlineMigration makes the same upgrade from
// the oldest release every later migration is online from (schema 5, the
// data model's redesign, was the last offline one): a deployment that
// skipped releases applies several migrations in one `helm upgrade`, and
// its old pods run on a schema some versions newer than theirs until the
// rollout replaces them. Connected directly, and behind PgBouncer, where
// the old instance goes on through the statements its release sent there
// (statement functions came later) while the new one uses this version's
// functions.
func TestRollingUpgradeAcrossEveryOnlineMigration(t *testing.T) {
	scenario(t, heavy, 32*time.Second)
	ms := migrations(t)
	first := firstOnlineRun(ms)
	if first >= len(ms)-1 {
		t.Skipf("no online migration before the newest (%s) since the last offline one: TestRollingUpgradeAcrossTheNewestMigration makes what upgrade there is", ms[len(ms)-1].Name)
	}
	old, oldVersion := buildBeforeMigration(t, ms[first])
	t.Run("Direct", func(t *testing.T) { rollingUpgrade(t, old, oldVersion, false) })
	t.Run("BehindPgBouncer", func(t *testing.T) { rollingUpgrade(t, old, oldVersion, true) })
}

// deliveryFunctions are the insert's and the result write's statement
// functions in calls, only those called when called is set.
func deliveryFunctions(calls map[string]int64, called bool) (fns []string) {
	for fn, n := range calls {
		if (n > 0 || !called) && (strings.HasPrefix(fn, "forward_stmt_insert_") || strings.HasPrefix(fn, "forward_stmt_record_")) &&
			!strings.HasPrefix(fn, "forward_stmt_insert_backstop_") {
			fns = append(fns, fn)
		}
	}
	return fns
}

// firstOnlineRun is the index in ms of the oldest migration after the last
// offline one (len(ms) when the newest is offline): the release before it
// is the oldest that every later migration lets run. When none is offline
// that is the first release with a schema, the one before the second
// migration.
func firstOnlineRun(ms []outboxdb.Migration) int {
	first := len(ms)
	for first > 1 && ms[first-1].Online {
		first--
	}
	return first
}

func migrations(t *testing.T) []outboxdb.Migration {
	t.Helper()
	ms, err := outboxdb.Migrations()
	if err != nil || len(ms) < 2 {
		t.Fatalf("migrations: %d, %v", len(ms), err)
	}
	return ms
}

func rollingUpgrade(t *testing.T, old build, oldVersion int, pooled bool) {
	s := newStack(t, stackOptions{
		emptyDB: true,
		faults: mockplatform.Faults{Latency: 2 * time.Millisecond, LatencyJitter: 8 * time.Millisecond,
			HTTP5xx: 0.02, FirstTry999: 0.05},
		// Leases long enough that a loaded machine never lets one run out:
		// a repeat would then be a fault of the upgrade.
		env: map[string]string{"CLAIM_LEASE": "30s", "FORWARD_TIMEOUT": "5s"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if pooled {
		_, dbName, url := s.startBouncer(ctx)
		s.env["DATABASE_URL"], s.env["DATABASE_DIRECT_URL"] = url, s.dsn
		s.trackFunctions(ctx, dbName)
	}
	version := func(ctx context.Context) int {
		t.Helper()
		v, err := outboxdb.SchemaVersion(ctx, s.pool)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// It answers /ping before its schema is made.
	a := s.startBuild("forwarder-old", old, nil)
	s.waitUntil(fmt.Sprintf("the old build to make schema %d", oldVersion), time.Minute, func(ctx context.Context) (bool, string) {
		v := version(ctx)
		return v == oldVersion, fmt.Sprintf("schema %d", v)
	})
	be := newBerthEvents()
	src := s.newSource(eventgen.SourceConfig{Berths: 200})
	const part, rate = 800, 400
	s.producePaced(src, part, rate, be)

	// Before its schema was made, the old instance's gauges found no
	// table: its log is read from here on.
	oldLogFrom := len(a.logBytes())
	// Behind PgBouncer, the functions there are now are the old
	// version's (none when it made none, as releases before schema 8 did).
	var oldFunctions []string
	if pooled {
		oldFunctions = deliveryFunctions(statementFunctionCalls(t, s.dsn, func(map[string]int64) bool { return true }), false)
	}
	out, err := runForwarder(t, s.env, "outbox", "migrate")
	if err != nil {
		t.Fatalf("outbox migrate beside the old instance: %v\n%s", err, out)
	}
	if v := version(ctx); v != outboxdb.LatestVersion() {
		t.Fatalf("outbox migrate left schema %d, want %d:\n%s", v, outboxdb.LatestVersion(), out)
	}
	var migratedAt time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&migratedAt); err != nil {
		t.Fatal(err)
	}
	t.Logf("migrated from schema %d to %d beside the old instance:\n%s", oldVersion, outboxdb.LatestVersion(), out)
	if len(oldFunctions) > 0 && !strings.Contains(out, "of other versions: once every instance runs this version") {
		t.Errorf("outbox migrate beside the old instance did not say it kept the old version's statement functions:\n%s", out)
	}

	// An old pod that restarts now refuses the newer schema (finish the
	// rollout), and says so.
	restarted := startBuild(t, "forwarder-old-restarted", old, s.env)
	if code, exited := s.awaitExit(restarted, time.Minute); !exited || code == 0 || restarted.countLines("newer than this binary") == 0 {
		t.Errorf("an old instance started on schema %d: %s, want it refused, saying the schema is newer than it:\n%s",
			outboxdb.LatestVersion(), restarted.state(), restarted.tail(3000))
	}

	// The old instance alone on the new schema.
	s.producePaced(src, part, rate, be)
	s.waitSettled(2 * time.Minute)
	var delivered, retried int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE result_status = 'SUCCESS'),
			count(*) FILTER (WHERE result_status = 'PENDING')
		FROM forward_retry_logs WHERE attempted_by = $1 AND attempted_at > $2`,
		a.claimer(), migratedAt).Scan(&delivered, &retried); err != nil {
		t.Fatal(err)
	}
	if delivered < part/2 || retried == 0 {
		t.Errorf("after the migration the old instance recorded %d deliveries and %d retries, want at least %d and one", delivered, retried, part/2)
	}

	// The rollout: a new instance beside it, then the old one stopped.
	b := s.start("forwarder-new", nil)
	s.producePaced(src, part/2, rate, be)
	a.term(t)
	s.producePaced(src, part/2, rate, be)
	if code, exited := a.waitExit(shutdownTimeout + 20*time.Second); !exited || code != 0 {
		t.Errorf("the old instance after SIGTERM: %s, want exit status 0:\n%s", a.state(), a.tail(4000))
	}
	s.waitSettled(2 * time.Minute)

	r := s.verify()
	if r.dupDeliveries > 0 {
		t.Errorf("%d messages were delivered more than once:%s", r.dupMessages, s.dupHistory(r))
	}
	s.checkOrder(be).assert(t)
	for _, l := range []struct {
		p    *proc
		from int
	}{{a, oldLogFrom}, {b, 0}} {
		if bad := grepLines(l.p.logBytes()[l.from:], "SQLSTATE", "level=error"); len(bad) > 0 {
			t.Errorf("%s logged a database error or an error on %d lines:\n%s", l.p.name, len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
		}
	}
	if pooled {
		// The old instance's insert and result write went through its
		// version's functions when it made them, the new one's through this
		// version's: every one called.
		want := len(oldFunctions) + 2
		calls := statementFunctionCalls(t, s.dsn, func(calls map[string]int64) bool {
			return len(deliveryFunctions(calls, true)) == want
		})
		called := deliveryFunctions(calls, true)
		for _, fn := range oldFunctions {
			if !slices.Contains(called, fn) {
				t.Errorf("the old version's %s was not called", fn)
			}
		}
		if len(called) != want {
			t.Errorf("statement functions called: %v, want the insert's and the result write's of this version and %v", calls, oldFunctions)
		}

		// The rollout done, the old version's functions are dropped, as
		// docs/deployment.md says to, and delivery goes on through this
		// version's.
		out, err := runForwarder(t, s.env, "outbox", "migrate", "--drop-old-statement-functions")
		if err != nil || (len(oldFunctions) > 0 && !strings.Contains(out, "of other versions\n")) {
			t.Errorf("outbox migrate --drop-old-statement-functions after the rollout: %v, want the old version's dropped\n%s", err, out)
		}
		var left int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = ANY ($1)`, oldFunctions).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left > 0 {
			t.Errorf("%d of the old version's statement functions %v left after the drop", left, oldFunctions)
		}
		s.producePaced(src, part/2, rate, be)
		s.waitSettled(2 * time.Minute)
		if r = s.verify(); r.dupDeliveries > 0 {
			t.Errorf("after the drop, %d messages were delivered more than once:%s", r.dupMessages, s.dupHistory(r))
		}
		s.checkOrder(be).assert(t)
		if missing := b.countLines("statement function is missing"); missing > 0 {
			t.Errorf("the new instance lost a statement function of its own to the drop (%d lines)", missing)
		}
	}
	t.Logf("the old instance recorded %d deliveries and %d retries on schema %d; %s", delivered, retried, outboxdb.LatestVersion(), r)
}

// buildBeforeMigration builds the forwarder as it was before migration m
// was added (the parent of the commit that added its file to
// internal/outboxdb/migrations, or HEAD while that file is not committed
// yet), from the repository's history into a temporary directory, and
// returns it with the schema version it migrates to. Without the history
// (a source archive, a shallow clone) there is no earlier build to run: the
// test is skipped, saying so.
func buildBeforeMigration(t *testing.T, m outboxdb.Migration) (build, int) {
	t.Helper()
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", repoRoot}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	if shallow, err := git("rev-parse", "--is-shallow-repository"); err != nil || shallow != "false" {
		t.Skipf("no earlier build to upgrade from: %s is not a git checkout with its history (%q, %v)", repoRoot, shallow, err)
	}
	file := filepath.Join("internal", "outboxdb", "migrations", m.Name+".sql")
	added, err := git("log", "-1", "--diff-filter=A", "--format=%H", "--", file)
	if err != nil {
		t.Fatalf("git log %s: %v", file, err)
	}
	rev := "HEAD"
	if added != "" {
		rev = added + "^"
	}

	dir := t.TempDir()
	tarball := filepath.Join(dir, "source.tar")
	if _, err := git("archive", "--format=tar", "-o", tarball, rev); err != nil {
		t.Fatalf("git archive %s: %v", rev, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", rev, err, out)
	}
	if _, err := os.Stat(filepath.Join(src, file)); err == nil {
		t.Fatalf("%s at %s already has %s", repoRoot, rev, file)
	}
	started := time.Now()
	b := build{bin: filepath.Join(src, "bin", "forwarder"), dir: src}
	cmd := exec.Command(goTool(), "build", "-o", b.bin, "./cmd/forwarder")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the forwarder at %s: %v\n%s", rev, err, out)
	}
	commit, _ := git("rev-parse", "--short", rev)
	t.Logf("built the forwarder at %s (%s, schema %d) in %s", commit, rev, m.Version-1, time.Since(started).Round(time.Second))
	return b, m.Version - 1
}

// TestFirstOnlineRun: the skipped-releases upgrade starts from the release
// before the oldest migration of the last run of online ones, and has none
// to start from when the newest is offline.
func TestFirstOnlineRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		online []bool
		want   int
	}{
		{[]bool{true, true, false, true, true, true}, 3},
		{[]bool{true, false, true}, 2},
		{[]bool{true, true, false}, 3},
		{[]bool{true, true}, 1},
		{[]bool{false, true, true}, 1},
	} {
		ms := make([]outboxdb.Migration, len(c.online))
		for i, on := range c.online {
			ms[i] = outboxdb.Migration{Version: i + 1, Online: on}
		}
		if got := firstOnlineRun(ms); got != c.want {
			t.Errorf("online %v: %d, want %d", c.online, got, c.want)
		}
	}
}
