package outboxdb

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/plural"
)

// The application_name of the service's connections (pg_stat_activity).
// RunningInstances finds running instances by them, so they are fixed: a
// release that changed them would make `outbox migrate` blind to the
// instances of the release before.
const (
	// ServiceApplicationName names the connections of the outbox
	// components: the stream's pool and the LISTEN connection.
	ServiceApplicationName = "forwarder"
	// MetricsApplicationName names the metrics exporter's connection.
	MetricsApplicationName = "forwarder-metrics"
)

// InstanceSession is a database session of a running forwarder instance.
type InstanceSession struct {
	PID             int
	ApplicationName string
	// Role is the role connected.
	Role string
	// Client is the client's address, "local" for a Unix socket, "" when
	// this role may not see it (another role's session without
	// pg_read_all_stats).
	Client string
}

// RunningInstances lists the sessions of running forwarder instances on the
// current database, from pg_stat_activity (application_name is visible to
// every role). Behind a transaction pooler the sessions are the pooler's,
// named after the last client they served; an instance always keeps its
// LISTEN connection open on DATABASE_DIRECT_URL, so it is seen there.
func RunningInstances(ctx context.Context, q Querier) ([]InstanceSession, error) {
	rows, err := q.Query(ctx, `SELECT pid, application_name, coalesce(usename::text, ''),
			CASE WHEN client_addr IS NOT NULL THEN host(client_addr)
			     WHEN client_port = -1 THEN 'local' ELSE '' END
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND application_name IN ($1, $2)
		ORDER BY pid`, ServiceApplicationName, MetricsApplicationName)
	if err != nil {
		return nil, fmt.Errorf("looking for running instances in pg_stat_activity: %w", err)
	}
	ss, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceSession, error) {
		var s InstanceSession
		return s, r.Scan(&s.PID, &s.ApplicationName, &s.Role, &s.Client)
	})
	if err != nil {
		return nil, fmt.Errorf("looking for running instances in pg_stat_activity: %w", err)
	}
	return ss, nil
}

// DescribeSessions says who the sessions are, for a message: how many, of
// which roles, from which addresses.
func DescribeSessions(ss []InstanceSession) string {
	var roles, clients []string
	seen := map[string]bool{}
	for _, s := range ss {
		if s.Role != "" && !seen["r"+s.Role] {
			seen["r"+s.Role] = true
			roles = append(roles, s.Role)
		}
		if s.Client != "" && !seen["c"+s.Client] {
			seen["c"+s.Client] = true
			clients = append(clients, s.Client)
		}
	}
	out := fmt.Sprintf("%s of forwarder instances (application_name %s or %s)", plural.Count(len(ss), "session", "sessions"), ServiceApplicationName, MetricsApplicationName)
	if len(roles) > 0 {
		out += ", role " + strings.Join(roles, ", ")
	}
	if len(clients) > 0 {
		if len(clients) > 5 {
			clients = append(clients[:5], "…")
		}
		out += ", from " + strings.Join(clients, ", ")
	}
	return out
}

// ErrTransactionPooler says that consecutive transactions of one connection
// may run on different server sessions: a transaction-pooling PgBouncer (or
// a pooler like it) is in between.
var ErrTransactionPooler = errors.New("the connection goes through a transaction-pooling connection pooler")

// CheckSession tells whether session state survives between the
// transactions of one connection made with cfg, as LISTEN, session advisory
// locks and migrations need. It returns ErrTransactionPooler when it does
// not, nil when it does.
//
// When the server sees the connection coming from the very port it left
// from, nothing is in between and the answer is yes. Otherwise (PgBouncer, a
// TCP proxy, NAT) it probes, a few rounds: a custom setting is made on the
// connection, a second connection holds a transaction open and reads it,
// and the first reads it again. Through a session (PostgreSQL, a proxy, a
// pooler in session mode) the first one still has it and the second never
// does. Through a transaction pooler the first connection's next
// transaction runs on another server session (PgBouncer gives the second
// connection the server connection used last, the first one's), or the
// second connection runs on the first one's session, or the first waits for
// the second's transaction when the pooler has no other server connection;
// other clients of the pooler can hide it in one round, not in all. A
// connection whose backend process changes from one round to the next is
// pooled too: a session keeps its backend.
//
// Only application_name is sent at connection start (a pooler refuses
// other startup parameters).
func CheckSession(ctx context.Context, cfg *pgx.ConnConfig) error {
	cfg = cfg.Copy()
	app := cfg.RuntimeParams["application_name"]
	cfg.RuntimeParams = map[string]string{}
	if app != "" {
		cfg.RuntimeParams["application_name"] = app
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol

	first, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return explainConnectError(err)
	}
	defer first.Close(context.WithoutCancel(ctx))
	var serverSeen *int32
	if err := first.QueryRow(ctx, "SELECT inet_client_port()").Scan(&serverSeen); err != nil {
		return fmt.Errorf("checking the session: %w", err)
	}
	if local, ok := first.PgConn().Conn().LocalAddr().(*net.TCPAddr); ok && serverSeen != nil && int(*serverSeen) == local.Port {
		return nil
	}
	second, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return explainConnectError(err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	var seen sessionPIDs
	for range sessionProbeRounds {
		if pooled, err := probeSession(ctx, first, second, &seen); err != nil || pooled {
			if pooled {
				return ErrTransactionPooler
			}
			return err
		}
	}
	return nil
}

// sessionProbeRounds bounds CheckSession's probe. A round through a
// transaction pooler that other clients keep busy reveals it about nine
// times in ten; a round costs three round trips, and only a connection that
// is not direct probes at all.
const sessionProbeRounds = 20

// sessionPIDs are the server processes each probing connection has run on
// so far: a session never changes its backend, so a second one is a pooler.
type sessionPIDs struct{ first, second int }

// sameBackend records pid as the backend a connection ran on and says
// whether it is the one it ran on before (true the first time).
func sameBackend(seen *int, pid int) bool {
	if *seen == 0 {
		*seen = pid
	}
	return *seen == pid
}

// probeSession is one round of CheckSession's probe.
func probeSession(ctx context.Context, first, second *pgx.Conn, seen *sessionPIDs) (pooled bool, err error) {
	const setting = "forwarder.session_check"
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	var pid1 int
	if err := first.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT set_config($1, $2, false)) s", setting, token).Scan(&pid1); err != nil {
		return false, fmt.Errorf("checking the session: %w", err)
	}
	if !sameBackend(&seen.first, pid1) {
		return true, nil
	}
	tx, err := second.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("checking the session: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var onSecond string
	var pidSecond int
	if err := tx.QueryRow(ctx, "SELECT coalesce(current_setting($1, true), ''), pg_backend_pid()", setting).Scan(&onSecond, &pidSecond); err != nil {
		return false, fmt.Errorf("checking the session: %w", err)
	}
	if onSecond == token || !sameBackend(&seen.second, pidSecond) {
		return true, nil
	}
	// A session of its own never waits to read a setting.
	readCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var onFirst string
	var pid2 int
	err = first.QueryRow(readCtx, "SELECT coalesce(current_setting($1, true), ''), pg_backend_pid()", setting).Scan(&onFirst, &pid2)
	switch {
	case readCtx.Err() != nil && ctx.Err() == nil:
		return true, nil
	case err != nil:
		return false, fmt.Errorf("checking the session: %w", err)
	}
	return onFirst != token || !sameBackend(&seen.first, pid2), nil
}

// explainConnectError adds what to do to the error PgBouncer gives a
// connection that sends a startup parameter it does not know.
func explainConnectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "unsupported startup parameter") {
		return fmt.Errorf("%w (a connection pooler refused a startup parameter: when DATABASE_URL leads to PgBouncer, set DATABASE_DIRECT_URL to PostgreSQL itself; docs/deployment.md)", err)
	}
	return err
}

// IsCertificateError says whether err is the server's TLS certificate
// failing verification (sslmode=verify-ca or verify-full): an unknown
// authority, a host name it does not name, an expired certificate. Such an
// error does not go away by trying again.
func IsCertificateError(err error) bool {
	var verr *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verr) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid)
}

// ErrReadOnly says the database takes no writes: its sessions are read-only,
// as on a hot standby or with default_transaction_read_only set for the
// database or the role.
var ErrReadOnly = errors.New("the database accepts no writes (a standby, or default_transaction_read_only is on): " +
	"the connection must lead to the primary; with several hosts, add target_session_attrs=read-write")

// readOnlySQLTransaction is PostgreSQL's SQLSTATE for a write refused in a
// read-only transaction.
const readOnlySQLTransaction = "25006"

// WhenReadOnly returns err as ErrReadOnly when it is PostgreSQL's refusal of
// a write in a read-only transaction, and then closes pool's connections
// (see CheckWritable). Other errors, nil included, are returned as they are.
func WhenReadOnly(pool *pgxpool.Pool, err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != readOnlySQLTransaction {
		return err
	}
	pool.Reset()
	return fmt.Errorf("%w: %w", ErrReadOnly, err)
}

// CheckWritable checks that pool leads to a database that takes writes: it
// fails as a ping does when the database does not answer, and with
// ErrReadOnly when its sessions are read-only. Then it closes the pool's
// connections (pgxpool.Pool.Reset), since a session stays on its server and
// keeps the read-only default it started with: new ones find the primary
// (target_session_attrs=read-write) or the default an administrator set back.
// A standby promoted under a session makes it writable by itself.
func CheckWritable(ctx context.Context, pool *pgxpool.Pool) error {
	var readOnly string
	if err := pool.QueryRow(ctx, "SHOW transaction_read_only").Scan(&readOnly); err != nil {
		return err
	}
	if readOnly != "off" {
		pool.Reset()
		return ErrReadOnly
	}
	return nil
}
