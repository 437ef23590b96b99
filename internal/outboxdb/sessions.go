package outboxdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	out := fmt.Sprintf("%d sessions of forwarder instances (application_name %s or %s)", len(ss), ServiceApplicationName, MetricsApplicationName)
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
// locks and migrations need. It sets a custom setting on one connection,
// then holds a transaction open on a second connection and reads the
// setting on both: through PostgreSQL itself the first one still has it and
// the second never does; through a transaction pooler the first
// connection's next transaction runs on another server session (the one it
// used is busy with the second connection's transaction, which PgBouncer
// gives the server connection used last), or the second connection runs on
// the first one's session. It returns ErrTransactionPooler when that
// happens, nil when the state stayed where it belongs.
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
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	const setting = "forwarder.session_check"

	first, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return explainConnectError(err)
	}
	defer first.Close(context.WithoutCancel(ctx))
	if _, err := first.Exec(ctx, "SELECT set_config($1, $2, false)", setting, token); err != nil {
		return fmt.Errorf("checking the session: %w", err)
	}
	second, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return explainConnectError(err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	tx, err := second.Begin(ctx)
	if err != nil {
		return fmt.Errorf("checking the session: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var onSecond string
	if err := tx.QueryRow(ctx, "SELECT coalesce(current_setting($1, true), '')", setting).Scan(&onSecond); err != nil {
		return fmt.Errorf("checking the session: %w", err)
	}
	if onSecond == token {
		return ErrTransactionPooler
	}
	// With one server connection left to it, a pooler makes the first
	// connection wait for the second one's transaction: a session of its
	// own never waits to read a setting.
	readCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var onFirst string
	err = first.QueryRow(readCtx, "SELECT coalesce(current_setting($1, true), '')", setting).Scan(&onFirst)
	switch {
	case readCtx.Err() != nil && ctx.Err() == nil:
		return ErrTransactionPooler
	case err != nil:
		return fmt.Errorf("checking the session: %w", err)
	case onFirst != token:
		return ErrTransactionPooler
	}
	return nil
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
