package outboxcli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxcli"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// runArgs runs `forwarder <args>` with only the outbox command.
func runArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{
		Name:           "forwarder",
		Writer:         &out,
		ErrWriter:      &out,
		Commands:       []*cli.Command{outboxcli.Command()},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	err := app.RunContext(context.Background(), append([]string{"forwarder"}, args...))
	return out.String(), err
}

func TestDatabaseURLFlag(t *testing.T) {
	// Not parallel: t.Setenv.
	dsn := pgtest.NewDB(t)
	const unreachable = "postgres://127.0.0.1:1/none?connect_timeout=2"
	t.Setenv("DATABASE_URL", unreachable)

	t.Run("AfterTheSubcommand", func(t *testing.T) {
		out, err := runArgs(t, "outbox", "stats", "--database-url", dsn)
		if err != nil || !strings.Contains(out, "rows by status:") {
			t.Fatalf("outbox stats --database-url: %v\n%s", err, out)
		}
	})
	t.Run("BeforeTheSubcommand", func(t *testing.T) {
		out, err := runArgs(t, "outbox", "--database-url", dsn, "stats")
		if err != nil || !strings.Contains(out, "rows by status:") {
			t.Fatalf("outbox --database-url stats: %v\n%s", err, out)
		}
	})
	t.Run("TheSubcommandsFlagWins", func(t *testing.T) {
		out, err := runArgs(t, "outbox", "--database-url", unreachable, "migrate", "--database-url", dsn)
		if err != nil || !strings.Contains(out, "schema is up to date") {
			t.Fatalf("outbox --database-url A migrate --database-url B did not use B: %v\n%s", err, out)
		}
	})
	t.Run("WithoutTheFlagDATABASE_URLApplies", func(t *testing.T) {
		_, err := runArgs(t, "outbox", "stats")
		if err == nil {
			t.Fatal("outbox stats with DATABASE_URL unreachable succeeded: it did not use DATABASE_URL")
		}
	})
}
