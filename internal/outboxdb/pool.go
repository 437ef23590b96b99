package outboxdb

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig tunes a pool opened with Open. Zero values keep pgx's defaults.
type PoolConfig struct {
	// MaxConns caps the pool's connections.
	MaxConns int32
	// ApplicationName is reported in pg_stat_activity.
	ApplicationName string
	// NoSeqScan turns enable_seqscan off on the pool's connections, for
	// components whose statements all reach their rows by key or through an
	// index (claim, result write, release, purge). pgx prepares statements,
	// and PostgreSQL switches a prepared statement to a generic plan after a
	// few executions; a generic plan made while forward_records was small
	// (a fresh install, the first minute of a test) joins by a sequential
	// scan, and keeps doing so as the table grows until the next ANALYZE.
	// Measured: a 6-row result write took 1.8 ms with that plan and 0.38 ms
	// with the primary key (internal/outboxdb TestGenericPlansUseIndexes).
	// The setting only makes sequential scans a last resort. It is a
	// startup parameter, so it is left out of Pooled connections (a pooler
	// refuses it), whose statements are never kept as generic plans.
	//
	// It turns JIT compilation off too: a sequential scan that remains (the
	// one-row forward_platform_state, which every instance reads each
	// second) is costed above 10^10, past every JIT threshold, and was
	// compiled with optimisation and inlining at each execution: 120 ms to
	// 1.7 s of the database's CPU for a read of one row (0.07 ms without),
	// a fifth of a core per instance. None of these statements runs long
	// enough for JIT to pay (internal/outboxdb
	// TestServiceStatementsAreNotJITCompiled).
	NoSeqScan bool
	// ReadCommitted asks for the isolation level the service's statements
	// are written for (see ReadCommitted) at connection start, which
	// overrides a default an administrator set for the role or the
	// database. Not for Pooled connections.
	ReadCommitted bool
	// Pooled says that the connection string leads to a transaction-pooling
	// PgBouncer (DATABASE_DIRECT_URL is set; docs/deployment.md, "Running on
	// production PostgreSQL"): consecutive transactions of one connection
	// may run on different server sessions. Statements are then sent as
	// unnamed ones whose description pgx caches (QueryExecModeCacheDescribe):
	// no server-side prepared statement, which PgBouncer 1.18 cannot carry
	// between sessions, one round trip once described, binary parameters,
	// and a plan made for each execution with its parameters. A
	// default_query_exec_mode in the connection string wins. No startup
	// parameter is sent but application_name.
	Pooled bool
}

// Open parses dsn (a libpq URL or key=value string), builds a pool and pings
// it. Errors never contain the DSN, which may hold a password.
func Open(ctx context.Context, dsn string, cfg PoolConfig) (*pgxpool.Pool, error) {
	pcfg, err := ParsePoolConfig(dsn, cfg)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("creating database pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to database %s: %w", Redact(pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Database), explainConnectError(err))
	}
	return pool, nil
}

// ParsePoolConfig parses dsn without touching the network, so that a
// constructor can validate it at config time.
func ParsePoolConfig(dsn string, cfg PoolConfig) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors redact the password, but the DSN is still better left out.
		return nil, fmt.Errorf("parsing database dsn: invalid connection string")
	}
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = cfg.MaxConns
	}
	if cfg.ApplicationName != "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	if cfg.Pooled {
		if !strings.Contains(dsn, "default_query_exec_mode") {
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		return pcfg, nil
	}
	if cfg.ReadCommitted {
		pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = ReadCommitted
	}
	if cfg.NoSeqScan {
		pcfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
		pcfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	return pcfg, nil
}

// ReadCommitted is the isolation level the statements are written for:
// each statement sees what committed before it started. A claim skips the
// rows other claims lock (SKIP LOCKED) and reads the rows they changed; the
// insert's last statement looks again, with a newer snapshot, for a
// message another transaction stored meanwhile. With a role or database
// whose default_transaction_isolation is repeatable read, that second look
// saw nothing new; with serializable, claims, inserts and result writes
// failed with serialization errors, dozens a minute under load. The
// service's pools ask for it at connection start (PoolConfig.ReadCommitted);
// start-up refuses a pooled DATABASE_URL whose sessions default to another
// level.
const ReadCommitted = "read committed"

// Redact describes a database without its credentials, for logs and errors.
func Redact(host string, port uint16, database string) string {
	return fmt.Sprintf("%s:%d/%s", host, port, database)
}
