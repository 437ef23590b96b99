package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// envConsoleURL is the console's own connection string.
const envConsoleURL = "CONSOLE_DATABASE_URL"

// consoleURL is the subcommand's --database-url, else CONSOLE_DATABASE_URL,
// else the outbox command's database; source names which, as databaseURL's.
func consoleURL(c *cli.Context) (dsn, source string) {
	if v := c.String(flagDatabaseURL); v != "" {
		return v, "--" + flagDatabaseURL
	}
	if v := os.Getenv(envConsoleURL); v != "" {
		return v, envConsoleURL
	}
	return databaseURL(c)
}

func consoleCommand() *cli.Command {
	return &cli.Command{
		Name:      "console",
		Usage:     "Serve the operator's web console (overview, failed rows, search, row pages, requeue, pause)",
		UsageText: "forwarder outbox console [--addr 127.0.0.1:4196] [--read-only] [--operator NAME] [--mappings DIR]",
		Description: `Serves a web console on CONSOLE_ADDR (default 127.0.0.1:4196) until SIGINT or
SIGTERM. Listening on an address that is not loopback requires CONSOLE_TOKEN
(at least 32 random characters: openssl rand -hex 24); every request must
then carry it: a browser logs in with a name and the token (a session
cookie, ended on the server by logging out), scripts send
"Authorization: Bearer <token>", or basic auth with the token as password
and their name as user. Without a token the console is open to every user
of this machine: plates and payloads are personal data, so set a token on a
shared host.

Actions: requeue a row or a group of FAILED rows (each shows what it will
change first and needs a confirmation), and pause or resume delivery as
"outbox pause" and "outbox resume" do. Each is recorded with the
operator's name in forward_operator_log (a requeue also in the rows'
attempt logs). The operator is the name given at login, the basic-auth
user, or --operator (default $USER) for requests that carry no name.
--read-only removes the actions.
Every lookup runs with a statement timeout (--timeout) and a row limit.
Behind a proxy, set CONSOLE_TOKEN even on loopback, and have the proxy pass
the browser's Host on (docs/operations.md, the console's security model).

It connects to CONSOLE_DATABASE_URL when set (a role of its own, read-only
or with the grants its actions need: docs/deployment.md), else DATABASE_URL
(or --database-url, which wins over both). A role without the grants of the
actions serves the console read-only. Started while a schema migration runs,
it says so and waits for the migration to finish.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: console.DefaultAddr, EnvVars: []string{"CONSOLE_ADDR"}, Usage: "host:port to listen on"},
			&cli.BoolFlag{Name: "read-only", Usage: "hide and refuse the actions"},
			&cli.StringFlag{Name: "mappings", Value: defaultMappingsDir, Usage: "directory of the mapping files, for the request preview"},
			operatorFlag(),
			timeoutFlag(),
		},
		Action: func(c *cli.Context) error {
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			timeout, err := lookupTimeout(c)
			if err != nil {
				return err
			}
			cfg := console.Config{
				Addr: c.String("addr"), Token: os.Getenv("CONSOLE_TOKEN"), ReadOnly: c.Bool("read-only"),
				Operator: operator, MappingsDir: c.String("mappings"), StatementTimeout: timeout,
				Logger: slog.New(slog.NewTextHandler(c.App.ErrWriter, nil)),
			}
			// Refused before the database is touched: the address alone decides.
			if err := console.CheckAddr(cfg.Addr, cfg.Token); err != nil {
				return refusef(c, "%v", err)
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			dsn, source := consoleURL(c)
			return withPoolURL(c, dsn, source, func(_ context.Context, pool *pgxpool.Pool) error {
				switch st, err := schemaStateAfterMigration(ctx, pool, c.App.Writer); {
				case ctx.Err() != nil:
					return nil // stopped while waiting
				case err != nil:
					return err
				case st.Version == 0 && len(st.Elsewhere) > 0:
					// Migrating would make a second, empty outbox.
					return st.ElsewhereError()
				case st.Version < outboxdb.LatestVersion():
					return fmt.Errorf("the database schema is at version %d, the console needs %d: run forwarder outbox migrate (or start the service once)", st.Version, outboxdb.LatestVersion())
				}
				// A read-only role (docs/deployment.md, Roles and grants)
				// serves a console without actions instead of failing on
				// the first one.
				if missing, err := outboxdb.MissingGrants(ctx, pool, outboxdb.ConsoleReadGrants); err != nil {
					return err
				} else if len(missing) > 0 {
					return outboxdb.MissingGrantsError(ctx, pool, "the console", missing)
				}
				if !cfg.ReadOnly {
					missing, err := outboxdb.MissingGrants(ctx, pool, outboxdb.ConsoleActionGrants)
					if err != nil {
						return err
					}
					if len(missing) > 0 {
						cfg.ReadOnly = true
						fmt.Fprintf(c.App.Writer, "read-only: the database role lacks %s, which the actions need\n", strings.Join(missing, ", "))
					}
				}
				srv, err := console.New(cfg, pool)
				if err != nil {
					return err
				}
				return srv.Run(ctx, func(addr string) {
					mode := "token required"
					if cfg.Token == "" {
						mode = "open to local users: no CONSOLE_TOKEN"
					}
					if cfg.ReadOnly {
						mode += ", read-only"
					}
					fmt.Fprintf(c.App.Writer, "console on http://%s/ (%s)\n", addr, mode)
				})
			})
		},
	}
}

// schemaStateAfterMigration reads the schema's state once no migration
// holds its lock, looking again every second meanwhile (a Helm upgrade's
// migration Job may run while an operator opens the console): the console
// then serves the migrated schema instead of exiting. It says once that it
// waits.
func schemaStateAfterMigration(ctx context.Context, pool *pgxpool.Pool, w io.Writer) (outboxdb.SchemaState, error) {
	said := false
	for {
		st, err := outboxdb.ReadSchemaState(ctx, pool)
		if !errors.Is(err, outboxdb.ErrMigrationRunning) {
			return st, err
		}
		if !said {
			fmt.Fprintln(w, "waiting for the schema migration in progress to finish (forwarder outbox migrate, or a starting instance)")
			said = true
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
