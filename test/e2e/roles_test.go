package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// TestLeastPrivilegeRoles makes the three roles of docs/deployment.md
// ("Roles and grants") by running the SQL written there, as written, on a
// server of its own: the schema's owner migrates, the service runs with DML
// only, the console reads and requeues. Each role ends with exactly the
// privileges outboxdb lists (every table, view, sequence and function run
// with its owner's rights, every privilege compared). The
// service refuses to start before the migration (naming the command) and
// before the grants (naming the grant), then delivers as forwarder_service
// without a single permission error, through the breaker, the rate limit,
// retention and compensation; the console's role reads, requeues and leaves
// its audit row, and without the grants of the actions the console serves
// read-only.
func TestLeastPrivilegeRoles(t *testing.T) {
	scenario(t, light, 25*time.Second)
	pg := pgtest.StartCluster(t)
	blocks := roleBlocks(t)
	runBlocks(t, pg, blocks, "superuser")
	roleURL := func(role string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/forwarder?sslmode=disable", role, pg.Port)
	}
	owner, service, console := roleURL("forwarder_owner"), roleURL("forwarder_service"), roleURL("forwarder_console")

	s := newStack(t, stackOptions{database: pg.DSN("forwarder"),
		env: map[string]string{"DATABASE_URL": service, "FORWARD_RATE_LIMIT": "5000",
			"OUTBOX_RETENTION": "1d", "FAILED_REQUEUE_AFTER": "1s"}})

	// Before the migration: the service may not create the schema.
	refused(t, s, "before-migration", "run `forwarder outbox migrate` as the schema's owner", "role forwarder_service")
	out, err := runForwarder(t, mergeEnv(s.env, map[string]string{"DATABASE_MIGRATE_URL": owner}), "outbox", "migrate")
	if err != nil || !strings.Contains(out, "schema migrated from version 0") {
		t.Fatalf("outbox migrate as forwarder_owner: %v\n%s", err, out)
	}
	// Before the grants: the service names what it lacks, the first of its
	// grants among them.
	first := outboxdb.ServiceGrants[0]
	refused(t, s, "before-grants", "role forwarder_service lacks", first.Privileges[0]+" on "+first.Table)
	runBlocks(t, pg, blocks, "owner")

	want := map[string][]outboxdb.Grant{
		"forwarder_service": outboxdb.ServiceGrants,
		"forwarder_console": append(slices.Clone(outboxdb.ConsoleReadGrants), outboxdb.ConsoleActionGrants...),
	}
	for role, grants := range want {
		checkPrivileges(t, s, role, grants)
	}

	// The service as forwarder_service: a platform that is down for a while
	// (the breaker's shared state), a rate limit, retention and compensation
	// on, malformed messages (FAILED at once).
	if err := s.platform.SetFaults(mockplatform.Faults{HTTP5xx: 1}); err != nil {
		t.Fatal(err)
	}
	s.produce(s.newSource(eventgen.SourceConfig{MalformedRate: 0.02, DuplicateRate: 0.01}), load(1_500, 600))
	p := s.start("forwarder", nil)
	s.waitUntil("the breaker to open", 2*time.Minute, func(ctx context.Context) (bool, string) {
		state := s.breakerState(ctx)
		return state == "OPEN", state
	})
	if err := s.platform.SetFaults(mockplatform.Faults{}); err != nil {
		t.Fatal(err)
	}
	s.waitSettled(5 * time.Minute)
	r := s.verify()
	if n := p.countLines("permission denied"); n > 0 || p.countLines("42501") > 0 {
		t.Errorf("the service met permission errors (%d lines):\n%s", n, p.tail(4000))
	}

	// The console's role: reads, and requeues with its audit row.
	consoleEnv := mergeEnv(s.env, map[string]string{"DATABASE_URL": console})
	if out, err := runForwarder(t, consoleEnv, "outbox", "stats"); err != nil || !strings.Contains(out, "rows by status:") {
		t.Errorf("outbox stats as forwarder_console: %v\n%s", err, out)
	}
	if out, err := runForwarder(t, consoleEnv, "outbox", "requeue", "--status", "FAILED", "--operator", "e2e"); err != nil || !strings.Contains(out, "requeued") {
		t.Errorf("outbox requeue as forwarder_console: %v\n%s", err, out)
	}
	// Pausing and resuming go through their functions, not an UPDATE of
	// the breaker's state, which the console's role may not do.
	if out, err := runForwarder(t, consoleEnv, "outbox", "pause", "--until", "1h", "--operator", "e2e"); err != nil || !strings.Contains(out, "delivery paused by e2e") {
		t.Errorf("outbox pause as forwarder_console: %v\n%s", err, out)
	}
	if out, err := runForwarder(t, consoleEnv, "outbox", "resume", "--operator", "e2e"); err != nil || !strings.Contains(out, "delivery resumed by e2e") {
		t.Errorf("outbox resume as forwarder_console: %v\n%s", err, out)
	}
	var audits int
	if err := s.pool.QueryRow(context.Background(), "SELECT count(*) FROM forward_operator_log WHERE operator = 'e2e' AND action = 'requeue'").Scan(&audits); err != nil || audits != 1 {
		t.Errorf("%d audit rows of the console role's requeue (%v), want 1", audits, err)
	}
	// Without the grants of the actions (those of the table a requeue
	// writes), the console serves read-only.
	action := outboxdb.ConsoleActionGrants[0]
	if _, err := s.pool.Exec(context.Background(), fmt.Sprintf("REVOKE %s ON %s FROM forwarder_console",
		strings.Join(action.Privileges, ", "), pgx.Identifier{action.Table}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	if line := consoleStarts(t, mergeEnv(s.env, map[string]string{"CONSOLE_DATABASE_URL": console})); !strings.Contains(line, "read-only: the database role lacks "+action.Privileges[0]+" on "+action.Table) {
		t.Errorf("the console without the grants of its actions said %q, want that it serves read-only", line)
	}
	t.Logf("as forwarder_service: %s", r)
}

// roleBlock is one SQL block of docs/deployment.md's roles, and who runs it
// where (the comment before it: <!-- roles: superuser, postgres -->).
type roleBlock struct {
	who, db, sql string
}

func roleBlocks(t *testing.T) []roleBlock {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- roles: (\\w+), (\\w+) -->\n```sql\n(.*?)```")
	var blocks []roleBlock
	for _, m := range re.FindAllStringSubmatch(string(doc), -1) {
		blocks = append(blocks, roleBlock{who: m[1], db: m[2], sql: m[3]})
	}
	if len(blocks) < 4 {
		t.Fatalf("found %d role SQL blocks in docs/deployment.md, want the four of Roles and grants", len(blocks))
	}
	return blocks
}

// runBlocks runs the blocks of who (superuser, or owner: forwarder_owner).
func runBlocks(t *testing.T, pg *pgcluster.Cluster, blocks []roleBlock, who string) {
	t.Helper()
	ctx := context.Background()
	for _, b := range blocks {
		if b.who != who {
			continue
		}
		dsn := pg.DSN(b.db)
		if who == "owner" {
			dsn = fmt.Sprintf("postgres://forwarder_owner@127.0.0.1:%d/%s?sslmode=disable", pg.Port, b.db)
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		// CREATE DATABASE cannot run in the implicit transaction of a
		// multi-statement query: one statement at a time, as psql does.
		for _, stmt := range strings.Split(b.sql, ";") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := conn.Exec(ctx, stmt); err != nil {
				conn.Close(ctx)
				t.Fatalf("docs/deployment.md, as %s on %s: %s: %v", who, b.db, strings.TrimSpace(stmt), err)
			}
		}
		conn.Close(ctx)
	}
}

// checkPrivileges compares role's privileges on every table of the schema
// with grants: nothing missing, nothing more; and no DDL anywhere.
func checkPrivileges(t *testing.T, s *stack, role string, grants []outboxdb.Grant) {
	t.Helper()
	ctx := context.Background()
	pgtest.CheckGrants(t, s.pool, role, "docs/deployment.md", grants)
	var super, createRole, createDB, createInSchema, createInDB, owner bool
	if err := s.pool.QueryRow(ctx, `SELECT rolsuper, rolcreaterole, rolcreatedb,
			has_schema_privilege($1, 'public', 'CREATE'), has_database_privilege($1, current_database(), 'CREATE'),
			pg_has_role($1, 'forwarder_owner', 'USAGE')
		FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &createRole, &createDB, &createInSchema, &createInDB, &owner); err != nil {
		t.Fatal(err)
	}
	if super || createRole || createDB || createInSchema || createInDB || owner {
		t.Errorf("%s: superuser %v, createrole %v, createdb %v, create in public %v, create in the database %v, member of the owner %v; want none",
			role, super, createRole, createDB, createInSchema, createInDB, owner)
	}
}

// refused starts the service, which must exit by itself with an error
// holding every one of wants.
func refused(t *testing.T, s *stack, name string, wants ...string) {
	t.Helper()
	p := startProc(t, "forwarder-"+name, s.env)
	code, exited := s.awaitExit(p, 2*time.Minute)
	log := string(p.logBytes())
	if !exited || code == 0 {
		t.Fatalf("%s: the service started (exited %v, status %d):\n%s", name, exited, code, p.tail(3000))
	}
	for _, w := range wants {
		if !strings.Contains(log, w) {
			t.Fatalf("%s: the service's error does not say %q:\n%s", name, w, p.tail(3000))
		}
	}
	t.Logf("%s: %s", name, lastLine(log, wants[0]))
}

// consoleStarts runs `forwarder outbox console` with env until it says where
// it listens, and returns what it printed before (its notices).
func consoleStarts(t *testing.T, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testinputs.Forwarder(t, forwarderBin), "outbox", "console", "--addr", "127.0.0.1:0")
	cmd.Dir = repoRoot
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var said []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "console on http://") {
			return strings.Join(said, "\n")
		}
		said = append(said, sc.Text())
	}
	t.Fatalf("the console stopped before listening:\n%s", strings.Join(said, "\n"))
	return ""
}
