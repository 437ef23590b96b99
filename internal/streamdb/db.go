// Package streamdb is the outbox database as one stream sees it: the
// connection settings every outbox component reads from its config (the dsn
// fields), and one pool per stream and database, shared by the stream's
// components, with the schema checked and an unreachable database waited for.
// It knows nothing of claims, messages or the platform.
package streamdb

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

// DB is one stream's outbox database: the components of the stream that
// name the same database find the same DB through the stream's resources,
// and share its pool. Two streams of one process (each with its own
// resources) have a DB each.
type DB struct {
	// Database describes the database without credentials, for logs.
	Database string

	pcfg *pgxpool.Config
	// direct is DATABASE_DIRECT_URL's connection settings, nil without it.
	direct *pgx.ConnConfig

	// log, outage and the retry delays pace and report the waits for an
	// unreachable database (connwait.go).
	log                    *service.Logger
	outage                 outage
	retryInitial, retryMax time.Duration

	mu    sync.Mutex
	pool  *pgxpool.Pool
	users int
	// missingLogged is the count of missing statement functions last
	// logged, so that each component's Open does not say it again; made
	// says this process made (or found) them, so later Opens skip it.
	missingLogged int
	made          bool
}

type dbKey struct{ database string }

// DefaultMaxConns is the size of a stream's pool for one database, unless
// the connection string sets pool_max_conns. Ingest holds one connection per
// batch being persisted, the dispatcher one per claim, the output one per
// result write, maintenance (retention, compensation) one at a time, and the
// platform gate keeps one for the shared state: eight leave room for all of
// them at once. pgx's own default grows with the CPU
// count of the node (38 connections per instance on a 16-core node, even
// when a container may use two of them).
const DefaultMaxConns = 8

// For returns the DB of the database dsn in the stream of res, creating it
// on first use. Components of one stream naming the same database (same
// host, port, database and user, however the DSN is spelled) get the same
// DB. Nothing touches the network.
func For(res *service.Resources, dsn string) (*DB, error) {
	return WithDirect(res, dsn, "")
}

// WithDirect is For with directDSN, when not empty, a direct
// connection to the same database for what needs a session of its own: it
// says that dsn leads to a transaction-pooling PgBouncer
// (docs/deployment.md, "Running on production PostgreSQL").
func WithDirect(res *service.Resources, dsn, directDSN string) (*DB, error) {
	pcfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{
		ApplicationName: outboxdb.ServiceApplicationName, NoSeqScan: true, ReadCommitted: true, Pooled: directDSN != ""})
	if err != nil {
		return nil, err
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pcfg.MaxConns = DefaultMaxConns
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	cc := pcfg.ConnConfig
	h := &DB{Database: outboxdb.Redact(cc.Host, cc.Port, cc.Database), pcfg: pcfg,
		log: res.Logger(), retryInitial: connectRetryInitial, retryMax: connectRetryMax}
	if directDSN != "" {
		dcfg, err := outboxdb.ParsePoolConfig(directDSN, outboxdb.PoolConfig{ApplicationName: outboxdb.ServiceApplicationName})
		if err != nil {
			return nil, directDSNError{err}
		}
		h.direct = dcfg.ConnConfig
		if h.direct.ConnectTimeout == 0 {
			h.direct.ConnectTimeout = 10 * time.Second
		}
	}
	v, _ := res.GetOrSetGeneric(dbKey{database: cc.User + "@" + h.Database}, h)
	return v.(*DB), nil
}

// directDSNError is a direct connection string that does not parse.
type directDSNError struct{ err error }

func (e directDSNError) Error() string { return e.err.Error() }

// New returns a DB that belongs to no stream, for tests and tools.
func New(dsn string) (*DB, error) {
	return For(service.MockResources(), dsn)
}

// Retain returns the stream's pool for this database, creating it on first
// use (connections are dialled when first needed), and counts one more user;
// every Retain must be matched by one Release.
func (h *DB) Retain() (*pgxpool.Pool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pool == nil {
		pool, err := pgxpool.NewWithConfig(context.Background(), h.pcfg.Copy())
		if err != nil {
			return nil, fmt.Errorf("creating database pool: %w", err)
		}
		h.pool = pool
	}
	h.users++
	return h.pool, nil
}

// Open retains the stream's pool (as Retain) and creates or upgrades the
// schema; on error nothing is retained. Components call it from Connect.
// While the database cannot be reached, or takes no writes (a standby), it
// waits, retrying with backoff (waitFor), until it can or ctx ends.
func (h *DB) Open(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := h.Retain()
	if err != nil {
		return nil, err
	}
	if err := h.waitFor(ctx, h.retryMax, func(ctx context.Context) error {
		if err := outboxdb.WhenReadOnly(pool, h.EnsureSchema(ctx, pool)); err != nil {
			return err
		}
		return outboxdb.CheckWritable(ctx, pool)
	}); err != nil {
		h.Release()
		return nil, err
	}
	if h.direct != nil {
		h.useStatementFunctions(ctx, pool)
	}
	return pool, nil
}

// useStatementFunctions makes the pooled pool run its statements through
// their functions (outboxdb.UseStatementFunctions), making those missing
// first when the role may change the schema. Without them the statements
// are sent as they are, planned at every execution: slower, not wrong, so
// nothing here stops the stream.
func (h *DB) useStatementFunctions(ctx context.Context, pool *pgxpool.Pool) {
	h.mu.Lock()
	made := h.made
	h.mu.Unlock()
	if !made {
		h.makeStatementFunctions(ctx, pool)
	}
	missing, err := outboxdb.UseStatementFunctions(ctx, pool)
	if err != nil {
		h.log.Warnf("Database %s: %v; statements behind the pooler are planned at every execution", h.Database, err)
		return
	}
	h.mu.Lock()
	changed := missing != h.missingLogged
	h.missingLogged = missing
	h.mu.Unlock()
	if changed && missing > 0 {
		h.log.Infof("Database %s: %s of this version %s missing, so those statements are planned at every execution behind the pooler; run `forwarder outbox migrate` as the schema's owner to make them (docs/deployment.md, PgBouncer)", h.Database, plural.Count(missing, "statement function", "statement functions"), plural.Noun(missing, "is", "are"))
	}
}

// makeStatementFunctions makes the statement functions missing, on the
// direct connection, when the role may change the schema; once made (or
// found), this process does not look again.
func (h *DB) makeStatementFunctions(ctx context.Context, pool *pgxpool.Pool) {
	if st, err := outboxdb.ReadSchemaState(ctx, pool); err != nil || !st.CanMigrate {
		return
	}
	conn, err := pgx.ConnectConfig(ctx, h.direct.Copy())
	if err != nil {
		h.log.Warnf("Database %s: connecting directly to make the statement functions: %v", h.Database, err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := outboxdb.MakeStatementFunctions(ctx, conn); err != nil {
		h.log.Warnf("Database %s: %v", h.Database, err)
		return
	}
	h.mu.Lock()
	h.made = true
	h.mu.Unlock()
}

// EnsureSchema checks the schema behind pool, the DB's pool, and migrates
// it when the service may (outboxdb.EnsureSchema), on the direct
// connection when there is one.
func (h *DB) EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var session *pgx.ConnConfig
	if h.direct != nil {
		session = h.direct.Copy()
	}
	return outboxdb.EnsureSchema(ctx, pool, session)
}

// Release drops one user of the pool; the last one closes it.
func (h *DB) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.users == 0 {
		return
	}
	h.users--
	if h.users == 0 && h.pool != nil {
		h.pool.Close()
		h.pool = nil
	}
}

// SessionConfig is a copy of the settings of a dedicated session (LISTEN,
// session advisory locks): the direct connection's when there is one, else
// the pool's.
func (h *DB) SessionConfig() *pgx.ConnConfig {
	if h.direct != nil {
		return h.direct.Copy()
	}
	return h.pcfg.ConnConfig.Copy()
}

// DirectConfig is a copy of the direct connection's settings, nil when the
// pool's connections are sessions of their own (no DATABASE_DIRECT_URL).
func (h *DB) DirectConfig() *pgx.ConnConfig {
	if h.direct == nil {
		return nil
	}
	return h.direct.Copy()
}

// MaxConns is the size of the stream's pool.
func (h *DB) MaxConns() int32 { return h.pcfg.MaxConns }
