package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/streamdb"
)

// outboxComponents are the config keys whose `dsn` field names an outbox
// database (the prometheus exporter's `outbox` block included).
var outboxComponents = map[string]bool{
	"outbox": true, "outbox_retry": true, "outbox_dead_letter": true, "http_forwarder": true,
}

// CheckSchemaOnStart refuses to start the service when its database cannot
// work, before any component starts (service.CLIOptOnConfigParse), instead
// of leaving the components to retry their connections for ever with the
// same error:
//
//   - DATABASE_URL goes through a transaction pooler and DATABASE_DIRECT_URL
//     is not set (or the direct one is pooled too);
//   - the schema is newer than this binary;
//   - the schema is behind and the service may not migrate it (its role
//     does not own the schema, or a pending migration is offline and the
//     database has a schema already): the error names the command to run;
//   - the role lacks a privilege the service needs;
//   - the server's TLS certificate is refused (a wrong CA, a host name it
//     does not name);
//   - DATABASE_URL leads to a pooler whose sessions default to an isolation
//     level other than read committed (outboxdb.ReadCommitted).
//
// An unreachable database is not an error here: the components wait for it,
// and a migration under way is waited for by them.
func CheckSchemaOnStart(pConf *service.ParsedConfig) error {
	root, err := pConf.FieldAny()
	if err != nil {
		return nil
	}
	dbs := map[database]struct{}{}
	collectDSNs(root, dbs)
	for db := range dbs {
		if err := checkDatabase(db); err != nil {
			return err
		}
	}
	return nil
}

// database is the connection strings of one outbox component, and the
// variables they come from (for messages).
type database struct {
	dsn, direct         string
	dsnName, directName string
}

func checkDatabase(db database) error {
	pcfg, err := outboxdb.ParsePoolConfig(db.dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: "forwarder-startup", Pooled: db.direct != ""})
	if err != nil {
		return nil // the component reports a bad DSN with its field name
	}
	where := outboxdb.Redact(pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Database)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	session, sessionName := pcfg.ConnConfig, db.dsnName
	if db.direct != "" {
		dcfg, err := outboxdb.ParsePoolConfig(db.direct, outboxdb.PoolConfig{ApplicationName: "forwarder-startup"})
		if err != nil {
			return nil // the component reports it
		}
		session, sessionName = dcfg.ConnConfig, db.directName
	}
	checkCtx, cancelCheck := context.WithTimeout(ctx, 15*time.Second)
	err = outboxdb.CheckSession(checkCtx, session)
	cancelCheck()
	switch {
	case errors.Is(err, outboxdb.ErrTransactionPooler) && db.direct == "":
		return fmt.Errorf("database %s: %s: %w (each transaction may run on another server session, so LISTEN, migrations and session locks cannot work through it): set %s to a direct connection to PostgreSQL, and %s keeps going through the pooler (docs/deployment.md, PgBouncer)",
			where, db.dsnName, err, db.directName, db.dsnName)
	case errors.Is(err, outboxdb.ErrTransactionPooler):
		return fmt.Errorf("database %s: %s: %w: it must lead to PostgreSQL itself (LISTEN, migrations and session locks need a session of their own)", where, sessionName, err)
	case outboxdb.IsCertificateError(err):
		return fmt.Errorf("database %s: %s: the server's certificate is refused (sslmode=verify-full checks it against sslrootcert and the host name; docs/configuration.md, Transport security): %v", where, sessionName, err)
	case err != nil:
		return nil // unreachable: the components wait for it
	}

	pool, err := outboxdb.Open(ctx, db.dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: "forwarder-startup", ReadCommitted: true, Pooled: db.direct != ""})
	if err != nil {
		return nil
	}
	defer pool.Close()
	var isolation, role string
	if err := pool.QueryRow(ctx, "SELECT current_setting('default_transaction_isolation'), current_user").Scan(&isolation, &role); err == nil && isolation != outboxdb.ReadCommitted {
		// Only a pooler's sessions can get here: the service's own
		// connections ask for read committed when they start.
		return fmt.Errorf("database %s: %s: its sessions default to isolation level %q (default_transaction_isolation, set for the role or the database), "+
			"and the service's statements are written for %q (the connections of a pooler take no setting from the service): "+
			"ALTER ROLE %s SET default_transaction_isolation = 'read committed' (docs/deployment.md, Running on production PostgreSQL)",
			where, db.dsnName, isolation, outboxdb.ReadCommitted, pgx.Identifier{role}.Sanitize())
	}
	st, err := outboxdb.ReadSchemaState(ctx, pool)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		if missing, merr := outboxdb.MissingGrants(ctx, pool, outboxdb.ServiceGrants); merr == nil && len(missing) > 0 {
			return fmt.Errorf("database %s: %w", where, outboxdb.MissingGrantsError(ctx, pool, "the service", missing))
		}
		return fmt.Errorf("database %s: %w", where, err)
	case err != nil:
		return nil // a migration under way, or a database going away: the components wait
	}
	latest := outboxdb.LatestVersion()
	switch {
	case st.Version > latest:
		return fmt.Errorf("database %s: %w: it is at version %d, this binary knows up to %d; upgrade the forwarder", where, outboxdb.ErrSchemaTooNew, st.Version, latest)
	case st.Version < latest && !st.CanMigrate:
		return fmt.Errorf("database %s: %w: it is at version %d, this binary needs %d, and role %s may not change the schema: run `forwarder outbox migrate` as the schema's owner (DATABASE_MIGRATE_URL; docs/deployment.md, Roles and grants)",
			where, outboxdb.ErrSchemaBehind, st.Version, latest, st.Role)
	case st.Version == 0 && len(st.Elsewhere) > 0:
		return fmt.Errorf("database %s: %w", where, st.ElsewhereError())
	case st.Version == 0:
		return nil // no schema: the first component creates all of it, offline steps included (outboxdb.MigrateConn)
	case st.Version < latest:
		ms, err := outboxdb.Migrations()
		if err != nil {
			return err
		}
		for _, m := range outboxdb.Pending(ms, st.Version) {
			if !m.Online {
				return fmt.Errorf("database %s: %w: it is at version %d, this binary needs %d, and migration %s must run with no instance using the database: stop the instances and run `forwarder outbox migrate` (docs/deployment.md, Upgrades)",
					where, outboxdb.ErrSchemaBehind, st.Version, latest, m.Name)
			}
		}
		return nil // online migrations: the first component applies them
	}
	missing, err := outboxdb.MissingGrants(ctx, pool, outboxdb.ServiceGrants)
	if err != nil {
		return nil
	}
	if len(missing) > 0 {
		return fmt.Errorf("database %s: %w", where, outboxdb.MissingGrantsError(ctx, pool, "the service", missing))
	}
	return nil
}

// componentDatabase is the connection strings of a component config: its
// dsn, else the environment variable its dsn_env names (DATABASE_URL by
// default), else the default; and the direct one likewise (none by
// default), as the components themselves resolve them.
func componentDatabase(conf map[string]any) database {
	db := database{dsnName: streamdb.DefaultDSNEnv, directName: streamdb.DefaultDirectDSNEnv}
	read := func(field, envField string, name *string) string {
		if v, ok := conf[field].(string); ok && v != "" {
			*name = "field " + field
			return v
		}
		if n, ok := conf[envField].(string); ok && n != "" {
			*name = n
		}
		return os.Getenv(*name)
	}
	db.dsn = read(streamdb.FieldDSN, streamdb.FieldDSNEnv, &db.dsnName)
	if db.dsn == "" {
		db.dsn = streamdb.DefaultDSN
	}
	db.direct = read(streamdb.FieldDirectDSN, streamdb.FieldDirectDSNEnv, &db.directName)
	return db
}

// collectDSNs finds the databases of every outbox component in a parsed
// config tree. Component configs are kept as YAML nodes (environment already
// interpolated), so they are decoded on the way.
func collectDSNs(node any, into map[database]struct{}) {
	switch n := node.(type) {
	case *yaml.Node:
		var v any
		if err := n.Decode(&v); err == nil {
			collectDSNs(v, into)
		}
	case map[string]any:
		for k, v := range n {
			if outboxComponents[k] {
				if m, ok := v.(map[string]any); ok {
					into[componentDatabase(m)] = struct{}{}
				}
			}
			collectDSNs(v, into)
		}
	case []any:
		for _, v := range n {
			collectDSNs(v, into)
		}
	}
}
