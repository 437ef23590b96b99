// Package outboxcli is the `forwarder outbox` command: schema migrations and
// the operator's tools (stats, requeue, purge, release, pause, resume) on the outbox tables.
package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/envcheck"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

const (
	defaultDatabaseURL = "postgres://localhost:5432/forwarder"
	flagDatabaseURL    = "database-url"
	envDatabaseURL     = "DATABASE_URL"
)

// Command returns the `outbox` command tree.
func Command() *cli.Command {
	cmd := &cli.Command{
		Name:  "outbox",
		Usage: "Manage the PostgreSQL outbox (DATABASE_URL)",
		Flags: []cli.Flag{
			// DATABASE_URL is read by databaseURL() rather than through the
			// flag's EnvVars, so that a message can say which of the two,
			// or the default, it was.
			&cli.StringFlag{
				Name:  flagDatabaseURL,
				Usage: "PostgreSQL URL or key=value string (default: $" + envDatabaseURL + ", else " + defaultDatabaseURL + ")",
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
			pauseCommand(),
			resumeCommand(),
		},
	}
	// The docs write `outbox stats --database-url URL` as often as
	// `outbox --database-url URL stats`: every subcommand takes the flag
	// too. Without a default or an environment variable of its own, so that
	// an unset subcommand flag falls back to the outbox command's value
	// (databaseURL).
	cmd.OnUsageError = usageError
	cmd.Action = unknownCommand
	for _, sub := range cmd.Subcommands {
		if sub.Name != "show" {
			sub.Before = refuseArguments
		}
		sub.OnUsageError = usageError
		sub.Flags = append(sub.Flags, &cli.StringFlag{
			Name:  flagDatabaseURL,
			Usage: "PostgreSQL URL or key=value string (default: $" + envDatabaseURL + ", else " + defaultDatabaseURL + ")",
		})
	}
	return cmd
}

// refuseArguments stops a command that takes flags only when it was given an
// argument. urfave/cli reads no flag after the first argument, so in
// `outbox requeue key-1 --dry-run` the --dry-run is an argument too, and the
// command would run for real, on every FAILED row, without it.
func refuseArguments(c *cli.Context) error {
	if c.NArg() == 0 {
		return nil
	}
	return refusef(c, "unexpected argument %s: this command takes flags only, and they go before any argument (see --help)",
		quoteArgs(c.Args().Slice()))
}

// usageError is how every outbox command reports a flag it does not know or
// a value that does not parse: one line naming the command, exit status 2
// like the commands' own refusals, instead of urfave/cli's page of help with
// the error on its first line and exit status 1.
func usageError(c *cli.Context, err error, _ bool) error {
	return refusef(c, "%v (see --help)", err)
}

// unknownCommand runs when `outbox` is given no subcommand it knows: the
// list of commands without an argument, else a refusal (exit status 2)
// rather than urfave/cli's "No help topic" and exit status 3.
func unknownCommand(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.ShowSubcommandHelp(c)
	}
	var names []string
	for _, sub := range c.Command.Subcommands {
		names = append(names, sub.Name)
	}
	return refusef(c, "no command %s: the commands are %s (forwarder outbox --help)",
		strconv.Quote(c.Args().First()), strings.Join(names, ", "))
}

// commandPath is "outbox" or "outbox <subcommand>", as messages start.
func commandPath(c *cli.Context) string {
	if c.Command == nil || c.Command.Name == "outbox" {
		return "outbox"
	}
	return "outbox " + c.Command.Name
}

// refusef is a command's refusal of what it was given (a flag, an
// argument, a value): one line that starts with the command's path, exit
// status 2.
func refusef(c *cli.Context, format string, args ...any) error {
	return cli.Exit(commandPath(c)+": "+fmt.Sprintf(format, args...), 2)
}

// failf is a command's failure to do what it was asked (the database, a row
// that is not there): one line that starts with the command's path, exit
// status 1.
func failf(c *cli.Context, format string, args ...any) error {
	return cli.Exit(commandPath(c)+": "+fmt.Sprintf(format, args...), 1)
}

// quoteArgs writes args as Go-quoted strings separated by spaces, so an
// operator sees exactly what the shell passed, control bytes escaped.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, " ")
}

// databaseURL is where a command connects: the subcommand's --database-url
// when given, else the outbox command's, else DATABASE_URL, else the
// default; source names which, for messages.
func databaseURL(c *cli.Context) (dsn, source string) {
	for _, ctx := range c.Lineage() {
		if v := ctx.String(flagDatabaseURL); v != "" {
			return v, "--" + flagDatabaseURL
		}
	}
	if v := os.Getenv(envDatabaseURL); v != "" {
		return v, envDatabaseURL
	}
	return defaultDatabaseURL, ""
}

// checkDatabaseURL checks dsn as the service's start-up does (internal/envcheck),
// so a malformed value is reported by the variable or flag that holds it,
// with the form expected and never the value (it may hold a password).
func checkDatabaseURL(dsn, source string) error {
	v, _ := envcheck.Lookup(envDatabaseURL)
	if source != "" {
		v.Name = source
	}
	return v.Check(dsn)
}

// withPool opens DATABASE_URL for one command. Errors exit non-zero with a
// message that never includes the URL (it may hold a password). The
// statements are sent as a transaction pooler can carry them
// (outboxdb.PoolConfig.Pooled), so DATABASE_URL may lead to PgBouncer.
func withPool(c *cli.Context, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	dsn, source := databaseURL(c)
	return withPoolURL(c, dsn, source, fn)
}

// withPoolURL opens dsn, which came from source (a flag or variable, "" for
// the default), after checking it as the service's start-up does.
//
// With neither --database-url nor DATABASE_URL the default is tried, and a
// failure says so: "connection refused" alone would not tell that the
// variable was never set.
func withPoolURL(c *cli.Context, dsn, source string, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	ctx := c.Context
	if err := checkDatabaseURL(dsn, source); err != nil {
		return refusef(c, "%v", err)
	}
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-outbox-cli", Pooled: true})
	if err != nil {
		if source == "" {
			return failf(c, "%s is not set (nor --%s), so the default %s was tried: %v; "+
				"set %s to the outbox database, e.g. postgres://user:password@host:5432/forwarder",
				envDatabaseURL, flagDatabaseURL, defaultDatabaseURL, err, envDatabaseURL)
		}
		return failf(c, "%v (database from %s)", err, source)
	}
	defer pool.Close()
	if err := outboxdb.WhenReadOnly(pool, fn(ctx, pool)); err != nil {
		var exit cli.ExitCoder
		if errors.As(err, &exit) {
			return err // a refusal that names its own exit status
		}
		// An error may quote a stored value (a key, a reason): escaped
		// like everything else the commands print.
		return failf(c, "%s", console.SafeText(err.Error()))
	}
	return nil
}
