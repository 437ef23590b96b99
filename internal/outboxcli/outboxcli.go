// Package outboxcli is the `forwarder outbox` command: schema migrations and
// the operator's tools (stats, requeue, purge) on the outbox tables.
package outboxcli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

const defaultDatabaseURL = "postgres://localhost:5432/forwarder"

// Command returns the `outbox` command tree.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "outbox",
		Usage: "Manage the PostgreSQL outbox (DATABASE_URL)",
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "database-url",
				Usage:   "PostgreSQL URL or key=value string",
				EnvVars: []string{"DATABASE_URL"},
				Value:   defaultDatabaseURL,
			},
		},
		Subcommands: []*cli.Command{
			migrateCommand(),
			statsCommand(),
			requeueCommand(),
			purgeCommand(),
			showCommand(),
			findCommand(),
			consoleCommand(),
		},
	}
}

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "Create or upgrade the outbox schema (also done on start); safe to run concurrently",
		Action: func(c *cli.Context) error {
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				res, err := outboxdb.Migrate(ctx, pool)
				if err != nil {
					return err
				}
				if len(res.Applied) == 0 {
					fmt.Fprintf(c.App.Writer, "schema is up to date at version %d\n", res.To)
					return nil
				}
				for _, m := range res.Applied {
					fmt.Fprintf(c.App.Writer, "applied %s\n", m)
				}
				fmt.Fprintf(c.App.Writer, "schema migrated from version %d to %d\n", res.From, res.To)
				return nil
			})
		},
	}
}

// withPool opens DATABASE_URL for one command. Errors exit non-zero with a
// message that never includes the URL (it may hold a password).
func withPool(c *cli.Context, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	ctx := c.Context
	pool, err := outboxdb.Open(ctx, c.String("database-url"), outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-outbox-cli"})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	defer pool.Close()
	if err := fn(ctx, pool); err != nil {
		return cli.Exit(fmt.Sprintf("outbox %s: %v", c.Command.Name, err), 1)
	}
	return nil
}
