package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

// The connection strings `outbox migrate` looks for, first set first
// (docs/configuration.md).
const (
	envMigrateURL = "DATABASE_MIGRATE_URL"
	envDirectURL  = "DATABASE_DIRECT_URL"
)

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:      "migrate",
		Usage:     "Create or upgrade the outbox schema, as its owner (DATABASE_MIGRATE_URL); safe to run concurrently",
		UsageText: "forwarder outbox migrate [--dry-run] [--force] [--lock-timeout 2s] [--lock-wait 5m] [--drop-old-statement-functions]",
		Description: `Applies the migrations this binary knows that the database lacks, printing each
step. It connects to DATABASE_MIGRATE_URL (the role that owns the schema), else
DATABASE_DIRECT_URL, else DATABASE_URL (or --database-url, which wins over all
three): a connection to PostgreSQL itself, never through a transaction-pooling
PgBouncer, which is refused.

Every statement waits at most --lock-timeout for a lock (0: as long as it
takes): one that is not granted in time (a long query holds the table) is
tried again after a pause, so writers never queue behind the migration for
longer, until --lock-wait has passed. A migration that is not online (the
service keeps working while it runs) is refused while forwarder instances use
the database, naming their sessions: stop them, or pass --force.
A migration that copies tables (the upgrade to schema 5) first says what it
locks, how many rows and bytes it copies, and how long it expects to hold the
lock. --dry-run prints the version, what would be applied with that plan, and
the running instances, and changes nothing.

It also makes the statement functions this version runs through behind
PgBouncer, and says how many functions of other versions are kept: once every
instance runs this version, --drop-old-statement-functions drops them (an
instance of another version still running sends its statements themselves
from then on, planned at each execution).`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print what would be done, change nothing"},
			&cli.BoolFlag{Name: "force", Usage: "apply offline migrations while instances use the database"},
			&cli.DurationFlag{Name: "lock-timeout", Value: outboxdb.DefaultLockTimeout, Usage: "longest wait for one lock (0: no limit)"},
			&cli.DurationFlag{Name: "lock-wait", Value: outboxdb.DefaultLockWait, DefaultText: outboxdb.FormatDuration(outboxdb.DefaultLockWait),
				Usage: "how long one step keeps trying after lock timeouts"},
			&cli.BoolFlag{Name: flagDropOldFunctions, Usage: "drop the statement functions of other versions of the forwarder"},
		},
		Action: runMigrate,
	}
}

const flagDropOldFunctions = "drop-old-statement-functions"

// migrateURL is the subcommand's --database-url, else DATABASE_MIGRATE_URL,
// else DATABASE_DIRECT_URL, else the outbox command's database; source
// names which, as databaseURL's ("" for the default).
func migrateURL(c *cli.Context) (dsn, source string) {
	if v := c.String(flagDatabaseURL); v != "" {
		return v, "--" + flagDatabaseURL
	}
	for _, name := range []string{envMigrateURL, envDirectURL} {
		if v := os.Getenv(name); v != "" {
			return v, name
		}
	}
	return databaseURL(c)
}

func runMigrate(c *cli.Context) error {
	ctx := c.Context
	out := c.App.Writer
	dsn, source := migrateURL(c)
	// Checked as the service's start-up and the other commands check it.
	if err := checkDatabaseURL(dsn, source); err != nil {
		return refusef(c, "%v", err)
	}
	if source == "" {
		source = fmt.Sprintf("the default, as none of %s, %s, %s is set", envMigrateURL, envDirectURL, envDatabaseURL)
	}
	pcfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{ApplicationName: "forwarder-migrate"})
	if err != nil {
		return failf(c, "%s: %v", source, err)
	}
	cc := pcfg.ConnConfig
	where := outboxdb.Redact(cc.Host, cc.Port, cc.Database)
	checkCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err = outboxdb.CheckSession(checkCtx, cc)
	cancel()
	if errors.Is(err, outboxdb.ErrTransactionPooler) {
		return failf(c, "%s (%s): %v: a migration needs a session of its own (a session lock, CREATE INDEX CONCURRENTLY); point %s or %s at PostgreSQL itself", source, where, err, envMigrateURL, envDirectURL)
	}
	if err != nil {
		return failf(c, "connecting to %s (%s): %v", where, source, err)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return failf(c, "connecting to %s (%s): %v", where, source, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if c.Bool("dry-run") {
		return dryRun(ctx, c, conn, where)
	}
	opts := outboxdb.MigrateOptions{
		Force: c.Bool("force"), LockTimeout: c.Duration("lock-timeout"), NoLockTimeout: c.Duration("lock-timeout") == 0,
		LockWait: c.Duration("lock-wait"),
		Progress: func(line string) { fmt.Fprintln(out, line) },
	}
	if v, err := outboxdb.SchemaVersion(ctx, conn); err == nil {
		ms, _ := outboxdb.Migrations()
		noteElsewhere(ctx, out, conn, v)
		printPlan(ctx, out, conn, outboxdb.Pending(ms, v), "to apply")
	}
	res, err := outboxdb.MigrateConn(ctx, conn, opts)
	switch {
	case errors.Is(err, outboxdb.ErrInstancesRunning):
		return failf(c, "%s: %v (kubectl scale deployment/forwarder --replicas=0; or --force)", where, err)
	case err != nil:
		return failf(c, "%s: %v", where, err)
	case len(res.Applied) == 0:
		fmt.Fprintf(out, "schema is up to date at version %d\n", res.To)
	default:
		for _, m := range res.Applied {
			fmt.Fprintf(out, "applied %s\n", m)
		}
		fmt.Fprintf(out, "schema migrated from version %d to %d\n", res.From, res.To)
	}
	// The functions this binary's statements run through behind a
	// transaction pooler (docs/deployment.md, PgBouncer).
	made, err := outboxdb.MakeStatementFunctions(ctx, conn)
	if err != nil {
		return failf(c, "%s: %v", where, err)
	}
	if made > 0 {
		fmt.Fprintf(out, "made %s (their plans are kept behind PgBouncer)\n", plural.Count(made, "statement function", "statement functions"))
	}
	others, err := outboxdb.OtherStatementFunctions(ctx, conn)
	if err != nil {
		return failf(c, "%s: %v", where, err)
	}
	switch {
	case len(others) == 0:
	case c.Bool(flagDropOldFunctions):
		if err := outboxdb.DropStatementFunctions(ctx, conn, others); err != nil {
			return failf(c, "%s: %v", where, err)
		}
		fmt.Fprintf(out, "dropped %s of other versions\n", plural.Count(len(others), "statement function", "statement functions"))
	default:
		fmt.Fprintf(out, "kept %s of other versions: once every instance runs this version, drop them with forwarder outbox migrate --%s\n",
			plural.Count(len(others), "statement function", "statement functions"), flagDropOldFunctions)
	}
	return nil
}

func dryRun(ctx context.Context, c *cli.Context, conn *pgx.Conn, where string) error {
	out := c.App.Writer
	v, err := outboxdb.SchemaVersion(ctx, conn)
	if err != nil {
		return failf(c, "%v", err)
	}
	ms, err := outboxdb.Migrations()
	if err != nil {
		return failf(c, "%v", err)
	}
	fmt.Fprintf(out, "%s is at schema version %d; this binary knows up to %d\n", where, v, outboxdb.LatestVersion())
	noteElsewhere(ctx, out, conn, v)
	pending := outboxdb.Pending(ms, v)
	printPlan(ctx, out, conn, pending, "would apply")
	if len(pending) == 0 {
		fmt.Fprintln(out, "nothing to apply")
	}
	sessions, err := outboxdb.RunningInstances(ctx, conn)
	if err != nil {
		return failf(c, "%v", err)
	}
	if len(sessions) == 0 {
		fmt.Fprintln(out, "no forwarder instance is using the database")
	} else {
		fmt.Fprintf(out, "running instances: %s\n", outboxdb.DescribeSessions(sessions))
	}
	return nil
}

// printPlan prints each pending migration and, for an offline one, what it
// locks, for how long and what to do first (docs/deployment.md, "Upgrading
// to schema 5"). A plan that cannot be read (statistics not readable by
// the role) costs the estimate, not the migration.
func printPlan(ctx context.Context, out io.Writer, conn *pgx.Conn, pending []outboxdb.Migration, verb string) {
	plans, err := outboxdb.PlanMigrations(ctx, conn, pending)
	if err != nil {
		for _, m := range pending {
			fmt.Fprintf(out, "%s: %s\n", verb, m.Describe())
		}
		fmt.Fprintf(out, "(no estimate: %v)\n", err)
		return
	}
	for _, p := range plans {
		fmt.Fprintf(out, "%s: %s\n", verb, p.Migration.Describe())
		for _, line := range p.Lines() {
			fmt.Fprintf(out, "  %s\n", line)
		}
	}
}

// noteElsewhere says, before a schema is made from nothing, that the
// database already holds an outbox the session's search_path does not lead
// to: the new one will be separate, and the service will use it.
func noteElsewhere(ctx context.Context, out io.Writer, conn *pgx.Conn, version int) {
	if version != 0 {
		return
	}
	if schemas, err := outboxdb.OutboxSchemasElsewhere(ctx, conn); err == nil && len(schemas) > 0 {
		var path string
		_ = conn.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&path)
		fmt.Fprintf(out, "note: schema %s already holds an outbox, which search_path %q does not lead to: this makes a second, separate one where it leads, and the service will use that one (if the search_path changed by mistake, set it back instead)\n",
			strings.Join(schemas, ", "), path)
	}
}
