// Package outboxcli is the `forwarder outbox` command: schema migrations and
// the operator's tools (stats, requeue, purge, release) on the outbox tables.
package outboxcli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

const (
	defaultDatabaseURL = "postgres://localhost:5432/forwarder"
	flagDatabaseURL    = "database-url"
)

// Command returns the `outbox` command tree.
func Command() *cli.Command {
	cmd := &cli.Command{
		Name:  "outbox",
		Usage: "Manage the PostgreSQL outbox (DATABASE_URL)",
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    flagDatabaseURL,
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
			releaseCommand(),
		},
	}
	// The docs write `outbox stats --database-url URL` as often as
	// `outbox --database-url URL stats`: every subcommand takes the flag
	// too. Without a default or an environment variable of its own, so that
	// an unset subcommand flag falls back to the outbox command's value
	// (databaseURL).
	for _, sub := range cmd.Subcommands {
		sub.Flags = append(sub.Flags, &cli.StringFlag{
			Name:  flagDatabaseURL,
			Usage: "PostgreSQL URL or key=value string (default: $DATABASE_URL, else " + defaultDatabaseURL + ")",
		})
	}
	return cmd
}

// databaseURL is the subcommand's --database-url when given, else the outbox
// command's (flag, DATABASE_URL or the default).
func databaseURL(c *cli.Context) string {
	for _, ctx := range c.Lineage() {
		if v := ctx.String(flagDatabaseURL); v != "" {
			return v
		}
	}
	return defaultDatabaseURL
}

// withPool opens DATABASE_URL for one command. Errors exit non-zero with a
// message that never includes the URL (it may hold a password). The
// statements are sent as a transaction pooler can carry them
// (outboxdb.PoolConfig.Pooled), so DATABASE_URL may lead to PgBouncer.
func withPool(c *cli.Context, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	return withPoolURL(c, databaseURL(c), fn)
}

func withPoolURL(c *cli.Context, dsn string, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	ctx := c.Context
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-outbox-cli", Pooled: true})
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	defer pool.Close()
	if err := fn(ctx, pool); err != nil {
		var exit cli.ExitCoder
		if errors.As(err, &exit) {
			return err // a refusal that names its own exit status
		}
		// An error may quote a stored value (a key, a reason): escaped
		// like everything else the commands print.
		return cli.Exit(fmt.Sprintf("outbox %s: %s", c.Command.Name, console.SafeText(err.Error())), 1)
	}
	return nil
}
