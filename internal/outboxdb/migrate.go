package outboxdb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/plural"
)

// Schema migrations (docs/deployment.md, "Schema changes while the service
// runs").
//
// A migration is an embedded file migrations/NNNN_description.sql. It is
// applied by `forwarder outbox migrate` (the migration role's command) and,
// when it is online, by the service on start. The file is SQL with a few
// directives, each a comment line of its own:
//
//	-- migration: online
//
// declares that instances of the previous schema version keep working
// while the migration runs and afterwards (it only adds: columns with
// defaults, tables, indexes). Without it a migration is offline: only
// `outbox migrate` applies it, and it refuses while instances use the
// database (RunningInstances) unless forced.
//
//	-- copies: forward_records, forward_retry_logs
//
// declares that the migration copies the rows of these tables while it
// holds an ACCESS EXCLUSIVE lock on them (nothing reads or writes them
// until it commits), so that `outbox migrate` can say beforehand how long
// from their size (PlanMigrations).
//
//	-- step: transaction | concurrent | batch
//
// starts a step. The SQL before the first step line is a transaction step.
// Steps run in order, each recorded in forwarder_schema_steps when done, so
// a migration that failed half way resumes at the step that failed:
//
//   - transaction: the step's statements in one transaction.
//   - concurrent: one statement outside any transaction, for what PostgreSQL
//     refuses to run in one (CREATE INDEX CONCURRENTLY, DROP INDEX
//     CONCURRENTLY). A CREATE INDEX CONCURRENTLY that fails leaves an
//     invalid index: it is dropped and the build starts again, and a valid
//     index of that name built by an interrupted run is kept. A build waits
//     for every transaction of the database, so other migrators wait for
//     the migration lock between statements, never inside one
//     (takeMigrationLock).
//   - batch: one statement run again and again, each run its own
//     transaction, until it changes no row: a backfill in small
//     transactions instead of one that locks every row until the end.
//     Write it so that it changes a bounded number of rows each time and
//     none once done (UPDATE ... WHERE id IN (SELECT id ... WHERE <not yet
//     done> LIMIT 1000 FOR UPDATE SKIP LOCKED)).
//
// Every statement runs with lock_timeout (MigrateOptions.LockTimeout): a
// lock that is not granted in time (a long query holds the table) fails the
// attempt instead of queueing every writer behind the migration's request,
// and the attempt is repeated after a pause, until MigrateOptions.LockWait
// has passed. No write waits for a migration longer than the lock timeout
// plus what the step does once it holds its lock, so steps that take a
// strong lock (ALTER TABLE) must be quick: add a column with a constant
// default, add a constraint NOT VALID and validate it in a later step, build
// indexes concurrently, backfill in batches.

//go:embed migrations/*.sql
var migrationFS embed.FS

// MigrationLockKey is the pg_advisory_lock key that serialises migrations, so
// that instances starting together do not race on the DDL. The service's
// schema check takes it shared (SchemaState), so an instance starting during
// a migration waits for its end instead of seeing half of it.
const MigrationLockKey int64 = 0x666f7277_61726472 // "forwardr"

// StepMode says how a migration step runs.
type StepMode string

// The step modes (see the comment at the top of this file).
const (
	StepTransaction StepMode = "transaction"
	StepConcurrent  StepMode = "concurrent"
	StepBatch       StepMode = "batch"
)

// Step is one step of a migration.
type Step struct {
	Mode StepMode
	// SQL is the step's text: statements for a transaction step, one
	// statement for the others.
	SQL string
	// Index is the index a concurrent CREATE INDEX step builds, "" for
	// other steps.
	Index string
}

// Migration is one embedded schema version.
type Migration struct {
	Version int
	Name    string
	// Online: instances of the previous version keep working while and
	// after it runs, so the service may apply it on start and `outbox
	// migrate` runs it while instances run.
	Online bool
	// Copies are the tables whose rows it copies under an ACCESS EXCLUSIVE
	// lock (the "-- copies:" directive).
	Copies []string
	Steps  []Step
}

// Describe says what m is and does, for a migration plan: its name,
// whether it is online, and its steps.
func (m Migration) Describe() string {
	kind := "offline: no instance may use the database while it runs"
	if m.Online {
		kind = "online"
	}
	steps := make([]string, len(m.Steps))
	for i, st := range m.Steps {
		steps[i] = string(st.Mode)
		if st.Index != "" {
			steps[i] += " index " + st.Index
		}
	}
	return fmt.Sprintf("%s (%s), %s: %s", m.Name, kind, plural.Count(len(m.Steps), "step", "steps"), strings.Join(steps, ", "))
}

var (
	stepLine      = regexp.MustCompile(`^--\s*step:\s*(\S*)\s*$`)
	directiveLine = regexp.MustCompile(`^--\s*migration:\s*(\S*)\s*$`)
	copiesLine    = regexp.MustCompile(`^--\s*copies:\s*(.*)$`)
	tableName     = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	createIndex   = regexp.MustCompile(`(?is)^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?((?:"[^"]+"|[\w$]+)(?:\.(?:"[^"]+"|[\w$]+))?)\s+ON\b`)
)

// ParseMigration reads a migration file: name is its file name
// (NNNN_description.sql), text its content.
func ParseMigration(name, text string) (Migration, error) {
	num, _, ok := strings.Cut(name, "_")
	if !ok || !strings.HasSuffix(name, ".sql") {
		return Migration{}, fmt.Errorf("migration %s: name must be NNNN_description.sql", name)
	}
	v, err := strconv.Atoi(num)
	if err != nil || v <= 0 {
		return Migration{}, fmt.Errorf("migration %s: bad version %q", name, num)
	}
	m := Migration{Version: v, Name: strings.TrimSuffix(name, ".sql")}
	mode := StepTransaction
	var cur []string
	flush := func() error {
		body := strings.TrimSpace(strings.Join(cur, "\n"))
		cur = nil
		if sqlText(body) == "" {
			if mode != StepTransaction || len(m.Steps) > 0 {
				return fmt.Errorf("migration %s: step %d (%s) holds no statement", name, len(m.Steps)+1, mode)
			}
			return nil // only the header comment before the first step line
		}
		st := Step{Mode: mode, SQL: body}
		if mode != StepTransaction {
			stmt := strings.TrimSuffix(strings.TrimSpace(sqlText(body)), ";")
			if strings.Contains(stmt, ";") {
				return fmt.Errorf("migration %s: step %d (%s) must be one statement", name, len(m.Steps)+1, mode)
			}
			if mode == StepConcurrent {
				if g := createIndex.FindStringSubmatch(stmt); g != nil {
					st.Index = g[1]
				}
			}
		}
		m.Steps = append(m.Steps, st)
		return nil
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if g := directiveLine.FindStringSubmatch(trimmed); g != nil {
			if g[1] != "online" {
				return Migration{}, fmt.Errorf("migration %s: unknown directive %q (the one known is \"-- migration: online\")", name, trimmed)
			}
			m.Online = true
			continue
		}
		if g := copiesLine.FindStringSubmatch(trimmed); g != nil {
			for _, table := range strings.Split(g[1], ",") {
				table = strings.TrimSpace(table)
				if !tableName.MatchString(table) {
					return Migration{}, fmt.Errorf("migration %s: %q: \"-- copies:\" takes table names separated by commas", name, trimmed)
				}
				m.Copies = append(m.Copies, table)
			}
			continue
		}
		if g := stepLine.FindStringSubmatch(trimmed); g != nil {
			if err := flush(); err != nil {
				return Migration{}, err
			}
			switch next := StepMode(g[1]); next {
			case StepTransaction, StepConcurrent, StepBatch:
				mode = next
			default:
				return Migration{}, fmt.Errorf("migration %s: unknown step mode %q: transaction, concurrent or batch", name, g[1])
			}
			// Marks the step as started even when its lines are all
			// comments, so that an empty step is reported.
			cur = append(cur, "")
			continue
		}
		cur = append(cur, line)
	}
	if err := flush(); err != nil {
		return Migration{}, err
	}
	if len(m.Steps) == 0 {
		return Migration{}, fmt.Errorf("migration %s holds no statement", name)
	}
	return m, nil
}

// sqlText is s without its comment lines and blank lines.
func sqlText(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		b, err := migrationFS.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		m, err := ParseMigration(e.Name(), string(b))
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// LatestVersion is the schema version this binary knows.
func LatestVersion() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

var (
	// ErrSchemaTooNew is returned when the database was migrated by a newer binary.
	ErrSchemaTooNew = errors.New("database schema is newer than this binary")
	// ErrSchemaBehind is returned to the service when the schema needs a
	// migration it may not apply itself: an offline one, or any when its
	// role may not change the schema (docs/deployment.md).
	ErrSchemaBehind = errors.New("database schema is older than this binary")
	// ErrInstancesRunning is returned when an offline migration would run
	// while instances of the service use the database.
	ErrInstancesRunning = errors.New("forwarder instances are using the database")
	// ErrMigrationRunning is returned by SchemaState while another session
	// holds the migration lock.
	ErrMigrationRunning = errors.New("a schema migration is running")
)

// Defaults of MigrateOptions.
const (
	DefaultLockTimeout = 2 * time.Second
	DefaultLockWait    = 5 * time.Minute
)

// MigrateOptions tune Migrate. Zero values take the defaults.
type MigrateOptions struct {
	// Migrations replaces the embedded migrations (tests add their own).
	Migrations []Migration
	// LockTimeout bounds each wait for a lock (PostgreSQL's lock_timeout):
	// how long writers may queue behind a statement of the migration that
	// waits for a lock. Default DefaultLockTimeout.
	LockTimeout time.Duration
	// NoLockTimeout waits for locks as long as it takes (a maintenance
	// window with nothing else running).
	NoLockTimeout bool
	// LockWait is how long one step keeps trying again after lock
	// timeouts, pausing between attempts (from LockTimeout, doubling, up to
	// ten times it) so that the writers queued meanwhile get through.
	// Default DefaultLockWait.
	LockWait time.Duration
	// Force runs offline migrations while instances use the database.
	Force bool
	// OnlineOnly refuses (ErrSchemaBehind) when a pending migration is
	// offline: the service on start.
	OnlineOnly bool
	// Progress, when set, receives a line for each step started and
	// finished and each lock timeout.
	Progress func(line string)
}

func (o MigrateOptions) withDefaults() (MigrateOptions, error) {
	if o.Migrations == nil {
		ms, err := Migrations()
		if err != nil {
			return o, err
		}
		o.Migrations = ms
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LockWait <= 0 {
		o.LockWait = DefaultLockWait
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	return o, nil
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	// From is the schema version found, To the version left.
	From, To int
	// Applied names the migrations applied by this call.
	Applied []string
}

// Migrate brings the schema behind pool up to LatestVersion on one of its
// connections, with the default options. pool must lead to PostgreSQL
// itself, not to a transaction pooler (Migrate holds a session lock).
func Migrate(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("acquiring connection for migration: %w", err)
	}
	defer conn.Release()
	res, err := MigrateConn(ctx, conn.Conn(), MigrateOptions{})
	if err != nil {
		// The session's settings (lock_timeout) must not outlive it.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
	}
	return res, err
}

// migrationLockPoll is how often a migration waiting for another one asks
// for the lock again.
const migrationLockPoll = 200 * time.Millisecond

// takeMigrationLock takes the session lock that serialises migrations,
// asking again every migrationLockPoll until it is granted or ctx ends. It
// never waits inside a statement: a CREATE INDEX CONCURRENTLY of the
// migration that holds the lock waits for every transaction running in the
// database to end, and a session blocked in pg_advisory_lock is one, so two
// instances starting together would deadlock (PostgreSQL then fails one).
func takeMigrationLock(ctx context.Context, conn *pgx.Conn) error {
	for {
		var granted bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", MigrationLockKey).Scan(&granted); err != nil {
			return err
		}
		if granted {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(migrationLockPoll):
		}
	}
}

// MigrateConn brings the schema up to the newest of opts.Migrations on conn,
// a session of its own (a direct connection, never through a transaction
// pooler). It holds a session advisory lock meanwhile, so concurrent callers
// wait for each other and the later ones find nothing to do. conn keeps the
// migration's session settings afterwards: close it.
func MigrateConn(ctx context.Context, conn *pgx.Conn, opts MigrateOptions) (MigrateResult, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return MigrateResult{}, err
	}
	ms := opts.Migrations
	if err := takeMigrationLock(ctx, conn); err != nil {
		return MigrateResult{}, fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must go even when ctx was cancelled.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", MigrationLockKey)
	}()
	// Set once the migration lock is held (waiting for another migration
	// is not waiting for a table). A step may take long: no statement
	// timeout a role or database may have set.
	lockTimeout := "0"
	if !opts.NoLockTimeout {
		lockTimeout = strconv.FormatInt(max(opts.LockTimeout.Milliseconds(), 1), 10)
	}
	if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false), set_config('statement_timeout', '0', false)", lockTimeout); err != nil {
		return MigrateResult{}, fmt.Errorf("setting the migration's lock_timeout: %w", err)
	}

	current, err := SchemaVersion(ctx, conn)
	if err != nil {
		return MigrateResult{}, err
	}
	res := MigrateResult{From: current, To: current}
	latest := 0
	if len(ms) > 0 {
		latest = ms[len(ms)-1].Version
	}
	if current > latest {
		return res, fmt.Errorf("%w: database is at version %d, this binary knows up to %d; upgrade the forwarder", ErrSchemaTooNew, current, latest)
	}
	pending := Pending(ms, current)
	if len(pending) == 0 {
		return res, nil
	}
	// A database without a schema has no instance of an earlier version to
	// keep working: the whole schema is created, offline steps included.
	if offline := firstOffline(pending); offline != "" && current > 0 {
		if opts.OnlineOnly {
			return res, fmt.Errorf("%w: it is at version %d, this binary needs %d, and migration %s must run with no instance using the database: stop the instances and run `forwarder outbox migrate`", ErrSchemaBehind, current, latest, offline)
		}
		if !opts.Force {
			sessions, err := RunningInstances(ctx, conn)
			if err != nil {
				return res, err
			}
			if len(sessions) > 0 {
				return res, fmt.Errorf("%w: %s; migration %s must run with no instance using the database (it is offline): stop them first, or force it", ErrInstancesRunning, DescribeSessions(sessions), offline)
			}
		}
	}
	if err := ensureBookkeeping(ctx, conn); err != nil {
		return res, err
	}
	for _, m := range pending {
		if err := applyMigration(ctx, conn, m, opts); err != nil {
			return res, fmt.Errorf("applying migration %s: %w", m.Name, err)
		}
		res.To = m.Version
		res.Applied = append(res.Applied, m.Name)
	}
	return res, nil
}

// Pending returns the migrations of ms newer than version current.
func Pending(ms []Migration, current int) []Migration {
	var out []Migration
	for _, m := range ms {
		if m.Version > current {
			out = append(out, m)
		}
	}
	return out
}

func firstOffline(ms []Migration) string {
	for _, m := range ms {
		if !m.Online {
			return m.Name
		}
	}
	return ""
}

func ensureBookkeeping(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS forwarder_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("creating migrations table: %w", err)
	}
	// The steps done of a migration not finished yet; emptied when it is.
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS forwarder_schema_steps (
		version integer NOT NULL,
		step    integer NOT NULL,
		done_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (version, step))`); err != nil {
		return fmt.Errorf("creating migration steps table: %w", err)
	}
	return nil
}

// applyMigration runs the steps of m not done yet, then records m.
func applyMigration(ctx context.Context, conn *pgx.Conn, m Migration, opts MigrateOptions) error {
	rows, err := conn.Query(ctx, "SELECT step FROM forwarder_schema_steps WHERE version = $1", m.Version)
	if err != nil {
		return fmt.Errorf("reading the steps done: %w", err)
	}
	doneSteps, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("reading the steps done: %w", err)
	}
	done := map[int]bool{}
	for _, s := range doneSteps {
		done[s] = true
	}
	// finish records the migration, in the transaction of its last step
	// when that one is a transaction step.
	finish := func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "DELETE FROM forwarder_schema_steps WHERE version = $1", m.Version); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO forwarder_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
		return err
	}
	recordStep := func(tx pgx.Tx, n int) error {
		_, err := tx.Exec(ctx, "INSERT INTO forwarder_schema_steps (version, step) VALUES ($1, $2)", m.Version, n)
		return err
	}
	finished := false
	for i, st := range m.Steps {
		n, last := i+1, i == len(m.Steps)-1
		if done[n] {
			continue
		}
		label := fmt.Sprintf("%s step %d of %d (%s)", m.Name, n, len(m.Steps), st.Mode)
		if len(m.Steps) > 1 || st.Mode != StepTransaction {
			opts.Progress(label + ": started")
		}
		started := time.Now()
		var rowsChanged int64
		switch st.Mode {
		case StepTransaction:
			err = retryLocks(ctx, label, opts, func() error {
				return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, st.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
						return err
					}
					if last {
						return finish(tx)
					}
					return recordStep(tx, n)
				})
			})
			finished = last && err == nil
		case StepConcurrent:
			err = retryLocks(ctx, label, opts, func() error { return runConcurrent(ctx, conn, st) })
			if err == nil {
				err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return recordStep(tx, n) })
			}
		case StepBatch:
			for err == nil {
				var changed int64
				err = retryLocks(ctx, label, opts, func() error {
					tag, err := conn.Exec(ctx, st.SQL, pgx.QueryExecModeSimpleProtocol)
					changed = tag.RowsAffected()
					return err
				})
				rowsChanged += changed
				if changed == 0 {
					break
				}
			}
			if err == nil {
				err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return recordStep(tx, n) })
			}
		}
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", n, st.Mode, err)
		}
		if len(m.Steps) > 1 || st.Mode != StepTransaction {
			what := ""
			if st.Mode == StepBatch {
				what = ", " + plural.Count(rowsChanged, "row", "rows") + " changed"
			}
			opts.Progress(fmt.Sprintf("%s: done in %s%s", label, time.Since(started).Round(time.Millisecond), what))
		}
	}
	if !finished {
		return pgx.BeginFunc(ctx, conn, finish)
	}
	return nil
}

// runConcurrent runs a concurrent step. For CREATE INDEX CONCURRENTLY it
// first looks for an index of that name: a valid one was built by an earlier
// run whose step record was lost (nothing to do); an invalid one is what a
// failed or interrupted build leaves, dropped before building again. After a
// failed build the invalid index is dropped at once, so a step that gives up
// leaves nothing behind.
func runConcurrent(ctx context.Context, conn *pgx.Conn, st Step) error {
	if st.Index != "" {
		valid, exists, err := indexState(ctx, conn, st.Index)
		if err != nil {
			return err
		}
		if exists && valid {
			return nil
		}
		if exists {
			if err := dropIndexConcurrently(ctx, conn, st.Index); err != nil {
				return err
			}
		}
	}
	_, err := conn.Exec(ctx, st.SQL, pgx.QueryExecModeSimpleProtocol)
	if err != nil && st.Index != "" && ctx.Err() == nil {
		if _, exists, serr := indexState(ctx, conn, st.Index); serr == nil && exists {
			if derr := dropIndexConcurrently(ctx, conn, st.Index); derr != nil {
				return fmt.Errorf("%w (dropping the invalid index it left: %v)", err, derr)
			}
		}
	}
	return err
}

func indexState(ctx context.Context, conn *pgx.Conn, index string) (valid, exists bool, err error) {
	err = conn.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", index).Scan(&valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("looking up index %s: %w", index, err)
	}
	return valid, true, nil
}

func dropIndexConcurrently(ctx context.Context, conn *pgx.Conn, index string) error {
	// index comes from the migration's own text (createIndex), not from input.
	_, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+index, pgx.QueryExecModeSimpleProtocol)
	return err
}

// retryLocks runs fn until it succeeds, fails on something other than a
// lock it could not get in time (lock_timeout) or a deadlock, or
// opts.LockWait has passed since the first attempt. Between attempts it
// pauses (LockTimeout, doubling up to ten times it, ±20 %), so that the
// writers that queued behind the failed attempt get their turn.
func retryLocks(ctx context.Context, label string, opts MigrateOptions, fn func() error) error {
	deadline := time.Now().Add(opts.LockWait)
	pause := opts.LockTimeout
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !isLockConflict(err) {
			return err
		}
		if time.Now().Add(pause).After(deadline) {
			return fmt.Errorf("gave up after %d attempts in %s, each refused a lock within lock_timeout %s (a long transaction holds the table: see pg_stat_activity): %w",
				attempt, opts.LockWait, opts.LockTimeout, err)
		}
		wait := time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
		opts.Progress(fmt.Sprintf("%s: attempt %d got no lock within %s (%s); trying again in %s",
			label, attempt, opts.LockTimeout, conflictReason(err), wait.Round(time.Millisecond)))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 10*opts.LockTimeout)
	}
}

func isLockConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

func conflictReason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}

// SchemaVersion reports the version recorded in the database (0 when none).
func SchemaVersion(ctx context.Context, q Querier) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('forwarder_schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM forwarder_schema_migrations").Scan(&v); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}

// ErrSchemaElsewhere says that the session's search_path leads to no
// outbox while the database holds one in another schema: an administrator
// changed the role's or the database's search_path. Migrating there would
// make a second, empty outbox, and the rows of the first would never be
// sent; so the service does not, and `outbox migrate` says so first.
var ErrSchemaElsewhere = errors.New("the session's search_path leads to no outbox, and the database holds one in another schema")

// OutboxSchemasElsewhere lists the schemas of the database that hold an
// outbox (its migrations table) where the session's search_path does not
// lead.
func OutboxSchemasElsewhere(ctx context.Context, q Querier) ([]string, error) {
	var schemas []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname), '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'forwarder_schema_migrations' AND c.relkind = 'r' AND NOT pg_table_is_visible(c.oid)`).Scan(&schemas)
	if err != nil {
		return nil, fmt.Errorf("looking for the outbox in other schemas: %w", err)
	}
	return schemas, nil
}

// SchemaState is what the service needs to know of the schema on start.
type SchemaState struct {
	// Version is the version recorded.
	Version int
	// CanMigrate says whether the role may change the schema: it owns the
	// tables (is a member of their owner), or may create in the schema when
	// there are none yet.
	CanMigrate bool
	// Role is the role connected.
	Role string
	// Elsewhere, when Version is 0, lists the schemas that hold an outbox
	// the session's search_path (SearchPath) does not lead to.
	Elsewhere  []string
	SearchPath string
}

// ElsewhereError is ErrSchemaElsewhere with where the outbox is, where the
// session looks, and what to do.
func (st SchemaState) ElsewhereError() error {
	return fmt.Errorf("%w: search_path is %q, schema %s holds an outbox: set the role's search_path back to it "+
		"(ALTER ROLE %s SET search_path = ...), or, for a second outbox where search_path leads, run `forwarder outbox migrate` first",
		ErrSchemaElsewhere, st.SearchPath, strings.Join(st.Elsewhere, ", "), pgx.Identifier{st.Role}.Sanitize())
}

// ReadSchemaState reads the schema version and whether the role may migrate
// it, through any connection (a pooler's too). It waits for no migration:
// while one holds the migration lock it returns ErrMigrationRunning, and
// the caller tries again later instead of starting on half a migration.
func ReadSchemaState(ctx context.Context, db TxBeginner) (SchemaState, error) {
	var st SchemaState
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var free bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock_shared($1)", MigrationLockKey).Scan(&free); err != nil {
			return err
		}
		if !free {
			return ErrMigrationRunning
		}
		v, err := SchemaVersion(ctx, tx)
		if err != nil {
			return err
		}
		st.Version = v
		if v == 0 {
			if st.Elsewhere, err = OutboxSchemasElsewhere(ctx, tx); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, `SELECT current_user::text, current_setting('search_path'), CASE
				WHEN to_regclass('forward_records') IS NOT NULL
				THEN pg_has_role((SELECT relowner FROM pg_class WHERE oid = to_regclass('forward_records')), 'USAGE')
				ELSE coalesce(has_schema_privilege(current_schema(), 'CREATE'), false)
			END`).Scan(&st.Role, &st.SearchPath, &st.CanMigrate)
	})
	if err != nil && !errors.Is(err, ErrMigrationRunning) {
		return st, fmt.Errorf("reading schema version: %w", err)
	}
	return st, err
}

// ensured remembers the databases this process has already found or made
// current, so that every component can call EnsureSchema on connect and
// only the first one pays for it.
var ensured sync.Map // database identity -> struct{}

// EnsureSchema is the service's schema check on start, once per process:
// every component that touches the outbox calls it when it connects. The
// schema must be at LatestVersion. When it is behind and every pending
// migration is online and the role owns the schema, it is migrated on a
// session of its own dialled from session (DATABASE_DIRECT_URL's settings
// behind a pooler; nil: a connection of pool, which then leads to
// PostgreSQL itself). Otherwise the error (ErrSchemaBehind) says which
// command to run. A failure is not remembered, so the next Connect tries
// again.
func EnsureSchema(ctx context.Context, pool *pgxpool.Pool, session *pgx.ConnConfig) error {
	cc := pool.Config().ConnConfig
	id := Redact(cc.Host, cc.Port, cc.Database)
	if _, ok := ensured.Load(id); ok {
		return nil
	}
	st, err := ReadSchemaState(ctx, pool)
	if err != nil {
		return fmt.Errorf("checking the schema of %s: %w", id, err)
	}
	latest := LatestVersion()
	switch {
	case st.Version == 0 && len(st.Elsewhere) > 0:
		return fmt.Errorf("checking the schema of %s: %w", id, st.ElsewhereError())
	case st.Version > latest:
		return fmt.Errorf("checking the schema of %s: %w: it is at version %d, this binary knows up to %d; upgrade the forwarder", id, ErrSchemaTooNew, st.Version, latest)
	case st.Version < latest && !st.CanMigrate:
		return fmt.Errorf("checking the schema of %s: %w: it is at version %d, this binary needs %d, and role %s may not change the schema: run `forwarder outbox migrate` as the schema's owner (DATABASE_MIGRATE_URL; docs/deployment.md)",
			id, ErrSchemaBehind, st.Version, latest, st.Role)
	case st.Version < latest:
		if err := migrateSession(ctx, pool, session); err != nil {
			return fmt.Errorf("migrating schema of %s: %w", id, err)
		}
	}
	ensured.Store(id, struct{}{})
	return nil
}

func migrateSession(ctx context.Context, pool *pgxpool.Pool, session *pgx.ConnConfig) error {
	opts := MigrateOptions{OnlineOnly: true}
	if session == nil {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("acquiring connection for migration: %w", err)
		}
		defer conn.Release()
		_, err = MigrateConn(ctx, conn.Conn(), opts)
		// Its session settings must not serve the pool's other users.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, session.Copy())
	if err != nil {
		return fmt.Errorf("connecting for the migration (DATABASE_DIRECT_URL): %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = MigrateConn(ctx, conn, opts)
	return err
}
