package outboxdb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLockKey is the pg_advisory_lock key that serialises migrations, so
// that instances starting together do not race on the DDL.
const migrationLockKey int64 = 0x666f7277_61726472 // "forwardr"

// Migration is one embedded schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad version: %w", name, err)
		}
		b, err := migrationFS.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(b)})
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

// ErrSchemaTooNew is returned when the database was migrated by a newer binary.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// MigrateResult says what Migrate did.
type MigrateResult struct {
	// From is the schema version found, To the version left.
	From, To int
	// Applied names the migrations applied by this call.
	Applied []string
}

// Migrate brings the schema up to LatestVersion. It holds a session advisory
// lock for the duration, so concurrent callers wait for each other and the
// second finds nothing to do. Each migration runs in its own transaction with
// its version row.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	ms, err := Migrations()
	if err != nil {
		return MigrateResult{}, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("acquiring connection for migration: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockKey); err != nil {
		return MigrateResult{}, fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must go even when ctx was cancelled.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLockKey)
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS forwarder_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return MigrateResult{}, fmt.Errorf("creating migrations table: %w", err)
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM forwarder_schema_migrations").Scan(&current); err != nil {
		return MigrateResult{}, fmt.Errorf("reading schema version: %w", err)
	}
	res := MigrateResult{From: current, To: current}
	latest := 0
	if len(ms) > 0 {
		latest = ms[len(ms)-1].Version
	}
	if current > latest {
		return res, fmt.Errorf("%w: database is at version %d, this binary knows up to %d; upgrade the forwarder", ErrSchemaTooNew, current, latest)
	}
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO forwarder_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("applying migration %s: %w", m.Name, err)
		}
		res.To = m.Version
		res.Applied = append(res.Applied, m.Name)
	}
	return res, nil
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

// ensured remembers the databases this process has already migrated, so that
// every component can call EnsureSchema on connect and only the first one
// pays for it.
var ensured sync.Map // database identity -> struct{}

// EnsureSchema migrates the database behind pool once per process: every
// component that touches the outbox calls it when it connects (the schema is
// created or upgraded on start, docs/architecture.md). Concurrent callers, here or in
// other instances, serialise on Migrate's advisory lock. A failure is not
// remembered, so the next Connect tries again; ErrSchemaTooNew keeps failing
// until the binary is upgraded.
func EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	cc := pool.Config().ConnConfig
	id := Redact(cc.Host, cc.Port, cc.Database)
	if _, ok := ensured.Load(id); ok {
		return nil
	}
	if _, err := Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrating schema of %s: %w", id, err)
	}
	ensured.Store(id, struct{}{})
	return nil
}
