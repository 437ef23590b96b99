package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
)

// Hub links the outbox components of one stream that share one database:
// the outbox processor, the outbox_retry dispatcher and the http_forwarder
// output. They find it through the stream's resources, so two streams of
// one process (each with its own resources) never hand rows to each other,
// and they share one connection pool.
//
// Nothing that goes through the hub is needed for correctness: a processor
// without a dispatcher inserts rows PENDING for any instance to claim, and
// an output without one relies on the lease its messages carry.
type Hub struct {
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

	mu         sync.Mutex
	pool       *pgxpool.Pool
	users      int
	dispatcher *Dispatcher
	output     *OutputInfo
	gate       *protection.Gate
}

// OutputInfo is what the output tells the rest of the stream about itself.
type OutputInfo struct {
	// Timeout bounds one request to the platform.
	Timeout time.Duration
	// MaxAttempts is the attempts a row may use (retry.max_attempts).
	MaxAttempts int
}

type hubKey struct{ database string }

// DefaultMaxConns is the size of a stream's pool for one database, unless
// the connection string sets pool_max_conns. Ingest holds one connection per
// batch being persisted, the dispatcher one per claim, the output one per
// result write, maintenance (retention, compensation) one at a time: eight
// leave room for all of them at once. pgx's own default grows with the CPU
// count of the node (38 connections per instance on a 16-core node, even
// when a container may use two of them).
const DefaultMaxConns = 8

// HubFor returns the hub of the database dsn in the stream of res, creating
// it on first use. Components of one stream naming the same database (same
// host, port, database and user, however the DSN is spelled) get the same
// hub. Nothing touches the network.
func HubFor(res *service.Resources, dsn string) (*Hub, error) {
	return HubWithDirect(res, dsn, "")
}

// HubWithDirect is HubFor with directDSN, when not empty, a direct
// connection to the same database for what needs a session of its own: it
// says that dsn leads to a transaction-pooling PgBouncer
// (docs/deployment.md, "Running on production PostgreSQL").
func HubWithDirect(res *service.Resources, dsn, directDSN string) (*Hub, error) {
	pcfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{
		ApplicationName: outboxdb.ServiceApplicationName, NoSeqScan: true, Pooled: directDSN != ""})
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
	h := &Hub{Database: outboxdb.Redact(cc.Host, cc.Port, cc.Database), pcfg: pcfg,
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
	v, _ := res.GetOrSetGeneric(hubKey{database: cc.User + "@" + h.Database}, h)
	return v.(*Hub), nil
}

// directDSNError is a direct connection string that does not parse.
type directDSNError struct{ err error }

func (e directDSNError) Error() string { return e.err.Error() }

// NewHub returns a hub that belongs to no stream, for tests and tools.
func NewHub(dsn string) (*Hub, error) {
	return HubFor(service.MockResources(), dsn)
}

// Retain returns the stream's pool for this database, creating it on first
// use (connections are dialled when first needed), and counts one more user;
// every Retain must be matched by one Release.
func (h *Hub) Retain() (*pgxpool.Pool, error) {
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
// While the database cannot be reached it waits, retrying with backoff
// (waitFor), until it can or ctx ends.
func (h *Hub) Open(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := h.Retain()
	if err != nil {
		return nil, err
	}
	if err := h.waitFor(ctx, func(ctx context.Context) error { return h.EnsureSchema(ctx, pool) }); err != nil {
		h.Release()
		return nil, err
	}
	return pool, nil
}

// EnsureSchema checks the schema behind pool, the hub's pool, and migrates
// it when the service may (outboxdb.EnsureSchema), on the direct
// connection when there is one.
func (h *Hub) EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var session *pgx.ConnConfig
	if h.direct != nil {
		session = h.direct.Copy()
	}
	return outboxdb.EnsureSchema(ctx, pool, session)
}

// Release drops one user of the pool; the last one closes it.
func (h *Hub) Release() {
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
func (h *Hub) SessionConfig() *pgx.ConnConfig {
	if h.direct != nil {
		return h.direct.Copy()
	}
	return h.pcfg.ConnConfig.Copy()
}

// DirectConfig is a copy of the direct connection's settings, nil when the
// pool's connections are sessions of their own (no DATABASE_DIRECT_URL).
func (h *Hub) DirectConfig() *pgx.ConnConfig {
	if h.direct == nil {
		return nil
	}
	return h.direct.Copy()
}

// MaxConns is the size of the stream's pool.
func (h *Hub) MaxConns() int32 { return h.pcfg.MaxConns }

// ErrSecondDispatcher is returned when a stream has two outbox_retry inputs
// on one database: claims of one would starve the other's direct dispatch.
var ErrSecondDispatcher = errors.New("a stream may have one outbox_retry input per database")

func (h *Hub) setDispatcher(d *Dispatcher) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatcher != nil && h.dispatcher != d {
		return ErrSecondDispatcher
	}
	h.dispatcher = d
	return nil
}

func (h *Hub) dropDispatcher(d *Dispatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatcher == d {
		h.dispatcher = nil
	}
}

// Dispatcher returns the stream's dispatcher on this database, or nil.
func (h *Hub) Dispatcher() *Dispatcher {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dispatcher
}

// SetOutput registers the stream's output on this database. When a
// dispatcher is registered already, their settings are checked against each
// other; otherwise the dispatcher checks them when it registers.
func (h *Hub) SetOutput(info OutputInfo) error {
	h.mu.Lock()
	h.output = &info
	d := h.dispatcher
	h.mu.Unlock()
	if d != nil {
		return checkLease(d.cfg.Lease, info.Timeout)
	}
	return nil
}

// SetGate registers the gate protecting the platform (the output's).
func (h *Hub) SetGate(g *protection.Gate) {
	h.mu.Lock()
	h.gate = g
	h.mu.Unlock()
}

// Gate returns the stream's gate on this database, or nil.
func (h *Hub) Gate() *protection.Gate {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gate
}

// Output returns what the output registered, or nil.
func (h *Hub) Output() *OutputInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.output
}

// checkLease refuses a lease that a request could outlive: with the lease
// renewed while the dispatcher runs, this bounds what a crash costs, and a
// shorter lease would give every claim of a crashed instance to another
// while its requests may still be under way.
func checkLease(lease, timeout time.Duration) error {
	if timeout >= lease {
		return fmt.Errorf("CLAIM_LEASE (outbox_retry lease, %v) must exceed FORWARD_TIMEOUT (http_forwarder timeout, %v): set CLAIM_LEASE to at least %v", lease, timeout, timeout+time.Second)
	}
	return nil
}

// DSN fields shared by every component that reads or writes the outbox.
const (
	FieldDSN          = "dsn"
	FieldDSNEnv       = "dsn_env"
	FieldDirectDSN    = "direct_dsn"
	FieldDirectDSNEnv = "direct_dsn_env"

	// DefaultDirectDSNEnv names the environment variable a component reads
	// its direct connection string from when direct_dsn is not set.
	DefaultDirectDSNEnv = "DATABASE_DIRECT_URL"

	// DefaultDSNEnv names the environment variable a component reads its
	// connection string from when dsn is not set.
	DefaultDSNEnv = "DATABASE_URL"
	// DefaultDSN is used when neither dsn nor the variable is set.
	DefaultDSN = "postgres://localhost:5432/forwarder"
)

// DSNFields are the config fields naming the outbox database.
func DSNFields() []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(FieldDSN).
			Description("PostgreSQL connection string (libpq URL or key=value). Leave it unset to read it from the environment variable named by `dsn_env`: a value pasted into the config by `${...}` interpolation is parsed as YAML, which breaks or silently cuts passwords holding characters such as `#`, `*`, `!` or `: `. Never logged. Set `pool_max_conns` in it to change the size of the pool the stream's outbox components share (default 8).").
			Example("postgres://forwarder@db:5432/forwarder?sslmode=verify-full").
			Secret().
			Optional(),
		service.NewStringField(FieldDSNEnv).
			Description("The environment variable holding the connection string, read as is (any character works) when `dsn` is not set. When the variable is unset too, `" + DefaultDSN + "`.").
			Default(DefaultDSNEnv).
			Advanced(),
		service.NewStringField(FieldDirectDSN).
			Description("A direct connection to the same database, for what needs a session of its own (LISTEN, migrations, the retention lock), when `dsn` leads to a transaction-pooling PgBouncer. Setting it says that `dsn` is pooled: statements are then sent without server-side prepared statements. Leave it unset to read it from the environment variable named by `direct_dsn_env`; when that is unset too, `dsn` is taken to lead to PostgreSQL itself, and start-up refuses a `dsn` whose sessions do not survive between transactions. Never logged.").
			Example("postgres://forwarder@db:5432/forwarder?sslmode=verify-full").
			Secret().
			Optional().
			Advanced(),
		service.NewStringField(FieldDirectDSNEnv).
			Description("The environment variable holding `direct_dsn`, read as is when `direct_dsn` is not set.").
			Default(DefaultDirectDSNEnv).
			Advanced(),
	}
}

// DSNFromParsed returns the connection string a component's config names:
// dsn when set, else the environment variable named by dsn_env, else
// DefaultDSN.
func DSNFromParsed(conf *service.ParsedConfig) (string, error) {
	dsn, _, err := envsecret.Read(conf, FieldDSN)
	if err != nil || dsn != "" {
		return dsn, err
	}
	return DefaultDSN, nil
}

// DirectDSNFromParsed returns the direct connection string a component's
// config names (direct_dsn, else the variable named by direct_dsn_env), ""
// when there is none.
func DirectDSNFromParsed(conf *service.ParsedConfig) (string, error) {
	dsn, _, err := envsecret.Read(conf, FieldDirectDSN)
	return dsn, err
}

// DSNSource names where a component's connection string comes from, for
// error messages (never the value).
func DSNSource(conf *service.ParsedConfig) string {
	_, source, _ := envsecret.Read(conf, FieldDSN)
	return source
}

// HubFromParsed returns the hub of the database a component's config names.
// A connection string that does not parse is reported by where it comes
// from (DATABASE_URL, or the dsn field), never by value.
func HubFromParsed(conf *service.ParsedConfig, res *service.Resources) (*Hub, error) {
	dsn, err := DSNFromParsed(conf)
	if err != nil {
		return nil, err
	}
	direct, err := DirectDSNFromParsed(conf)
	if err != nil {
		return nil, err
	}
	h, err := HubWithDirect(res, dsn, direct)
	var derr directDSNError
	if errors.As(err, &derr) {
		_, source, _ := envsecret.Read(conf, FieldDirectDSN)
		return nil, fmt.Errorf("%s: %w", source, derr.err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", DSNSource(conf), err)
	}
	return h, nil
}
