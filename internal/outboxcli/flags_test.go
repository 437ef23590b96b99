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
		out, err := runArgs(t, "outbox", "stats")
		if err == nil {
			t.Fatal("outbox stats with DATABASE_URL unreachable succeeded: it did not use DATABASE_URL")
		}
		if !strings.Contains(err.Error(), "127.0.0.1:1/none") || !strings.Contains(err.Error(), "(database from DATABASE_URL)") {
			t.Errorf("the error does not say which database, from where: %v\n%s", err, out)
		}
	})
}

// TestDatabaseURLChecked: the operator commands check DATABASE_URL (and
// --database-url) as the service's start-up does, naming the variable and
// the expected form and never printing the value; without either they say
// that the default was tried because DATABASE_URL is not set.
func TestDatabaseURLChecked(t *testing.T) {
	// Not parallel: t.Setenv.
	const secret = "S3cret:pw"
	for _, c := range []struct {
		name, env string
		args      []string
		want      []string
	}{
		{name: "MalformedVariable", env: "postgres://forwarder:" + secret + "@db:port/forwarder",
			args: []string{"outbox", "stats"},
			want: []string{"outbox stats: DATABASE_URL: not a PostgreSQL connection string", "postgres://user:password@host:5432/forwarder", "not shown"}},
		{name: "MalformedKeyValue", env: "host=db password=" + secret + " port=abc",
			args: []string{"outbox", "find", "--plate", "x"},
			want: []string{"outbox find: DATABASE_URL: not a PostgreSQL connection string", "key=value pairs"}},
		{name: "MalformedFlag", env: "",
			args: []string{"outbox", "requeue", "--dry-run", "--database-url", "postgres://u:" + secret + "@db:port/x"},
			want: []string{"outbox requeue: --database-url: not a PostgreSQL connection string"}},
		{name: "Unset", env: "",
			args: []string{"outbox", "stats"},
			want: []string{"outbox stats: DATABASE_URL is not set (nor --database-url), so the default postgres://localhost:5432/forwarder was tried",
				"set DATABASE_URL to the outbox database, e.g. postgres://user:password@host:5432/forwarder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", c.env)
			// Unset: the default localhost:5432 is tried. Were a server to
			// answer there (a developer's own), stats only reads, and the
			// test fails for having succeeded.
			t.Setenv("PGCONNECT_TIMEOUT", "2")
			out, err := runArgs(t, c.args...)
			if err == nil {
				t.Fatalf("%v succeeded:\n%s", c.args, out)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: %q lacks %q", c.args, err, w)
				}
			}
			if strings.Contains(err.Error()+out, secret) {
				t.Errorf("%v: the error shows the password: %v", c.args, err)
			}
		})
	}
}

// TestArgumentsAreRefused: urfave/cli reads no flag after the first
// argument, so in `outbox requeue key-1 --dry-run` the --dry-run would be an
// argument too. Every command but show takes flags only: an argument is
// refused (exit status 2) before anything is done, instead of the command
// running without the flags written after it.
func TestArgumentsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, row{key: "f1", status: "FAILED", attempts: 5, class: "TRANSIENT"}, row{key: "f2", status: "FAILED", attempts: 5, class: "TRANSIENT"})
	for _, args := range [][]string{
		{"requeue", "f1", "--dry-run"},
		{"pause", "2h", "--reason", "maintenance"},
		{"resume", "now"},
		{"release", "P1/B1", "--dry-run"},
		{"purge", "--older-than", "30d", "--dry-run", "extra"},
		{"stats", "--json", "x"},
		{"find", "粤B12345", "--json"},
		{"migrate", "--dry-run", "now"},
		{"console", "--read-only", "127.0.0.1:0"},
	} {
		out, err := b.run(t, args...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "outbox "+args[0]+": unexpected argument") {
			t.Errorf("%s: exit %d, %v (%q); want exit status 2 naming the argument", strings.Join(args, " "), exitCode(err), err, out)
		}
	}
	for _, key := range []string{"f1", "f2"} {
		if s, _ := b.state(t, key); s.Status != "FAILED" || s.Requeues != 0 {
			t.Errorf("%s is %+v after refused commands, want FAILED and never requeued", key, s)
		}
	}
	// A pause or a resume would have written the operator log.
	if log := b.operatorLog(t); len(log) != 0 {
		t.Errorf("refused commands wrote the operator log: %+v", log)
	}

	t.Run("ShowSaysFlagsGoBeforeTheKey", func(t *testing.T) {
		out, err := b.run(t, "show", "f1", "--json")
		if exitCode(err) != 2 || !strings.Contains(err.Error(), `"f1" "--json"`) || !strings.Contains(err.Error(), "flags go before the key") {
			t.Errorf("show f1 --json: exit %d, %v (%q); want exit status 2 saying flags go before the key", exitCode(err), err, out)
		}
	})
}

// TestUnknownCommand: a mistyped command is refused as one, naming the
// commands there are, not taken for a help topic.
func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	out, err := runArgs(t, "outbox", "reqeue", "--dry-run")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), `outbox: no command "reqeue"`) || !strings.Contains(err.Error(), "requeue") {
		t.Errorf("outbox reqeue: exit %d, %v (%q); want exit status 2 naming the commands", exitCode(err), err, out)
	}
	out, err = runArgs(t, "outbox")
	if err != nil || !strings.Contains(out, "requeue") {
		t.Errorf("outbox alone: %v (%q); want its help", err, out)
	}
}

// TestUsageErrorsExitTwo: every mistake in how a command is called exits
// with status 2, as the refusals of the commands themselves do, so that a
// script tells a typo from a database that failed (1). urfave/cli's own
// checks (a flag it does not know, a value that does not parse, a required
// flag left out, a command that does not exist) exited 1 or 3, after a
// page of help that hid the one line saying what was wrong.
func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, row{key: "f1", status: "FAILED", attempts: 5, class: "TRANSIENT"})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"find", "--bogus"}, "outbox find: flag provided but not defined: -bogus"},
		{[]string{"find", "--limit", "abc"}, `outbox find: invalid value "abc" for flag -limit`},
		{[]string{"stats", "--top", "x"}, `outbox stats: invalid value "x" for flag -top`},
		{[]string{"stats", "--requeue-rounds", "-1"}, "outbox stats: --requeue-rounds -1 (FAILED_REQUEUE_ROUNDS): want 0 to"},
		// --top 0 and below listed ten, as if --top were not given.
		{[]string{"stats", "--top", "0"}, "outbox stats: --top 0: want at least 1"},
		{[]string{"stats", "--top", "-3"}, "outbox stats: --top -3: want at least 1"},
		{[]string{"requeue", "--batch-size", "99999999999999999999"}, "outbox requeue: invalid value"},
		{[]string{"requeue", "--dry-run", "--statuss", "FAILED"}, "outbox requeue: flag provided but not defined: -statuss"},
		{[]string{"requeue", "--dry-run", "--errcode", ""}, "outbox requeue: --errcode is empty: leave the flag out"},
		{[]string{"find", "--since", "106752d"}, `outbox find: --since: duration "106752d": too long`},
		{[]string{"release", "--key", "P1/B1", "--id", "7"}, "outbox release: name the blocked key (--key) or the FAILED row (--id), not both"},
		{[]string{"release", "--key", ""}, "outbox release: --key is empty"},
		{[]string{"release", "--id", "0"}, "outbox release: --id 0: want a row's id, at least 1"},
		{[]string{"release", "--id", "-1"}, "outbox release: --id -1: want a row's id, at least 1"},
		{[]string{"requeue", "--dry-run", "--key", "f1", "--key", ""}, `outbox requeue: invalid value "" for flag -key: a message key is never empty`},
		// No stored value holds them; PostgreSQL refused them with an error.
		{[]string{"find", "--plate", "\xff"}, `outbox find: plate "\xff": not text (a NUL byte, or bytes that are not UTF-8)`},
		{[]string{"requeue", "--dry-run", "--errcode", "99\xfe"}, `outbox requeue: errcode "99\xfe": not text`},
		{[]string{"requeue", "--dry-run", "--key", "f1", "--key", "a\xffb"}, `outbox requeue: key "a\xffb": not text`},
		{[]string{"show", "k\xff"}, `outbox show: message_key "k\xff": not text`},
		{[]string{"release", "--key", "P1/\xff"}, `outbox release: key "P1/\xff": not text`},
		{[]string{"release", "--id", "x"}, `outbox release: invalid value "x" for flag -id`},
		{[]string{"purge"}, "outbox purge: --older-than is required"},
		{[]string{"purge", "--older-than", "1h"}, "outbox purge: --older-than 1h is below the safe minimum of 1d"},
		{[]string{"pause", "--until", "tomorrow"}, "outbox pause: --until: "},
		{[]string{"resume", "--operator", " "}, "outbox resume: --operator must not be empty"},
		{[]string{"stats", "--top", "0"}, "outbox stats: --top 0: want at least 1"},
		{[]string{"purge", "--dry-run"}, "outbox purge: --older-than is required"},
		{[]string{"show", "--timeout", "soon", "f1"}, `outbox show: invalid value "soon" for flag -timeout`},
		// The statement timeout is set in milliseconds, and PostgreSQL
		// reads 0 as no timeout at all: below 1ms the lookup was unbounded.
		{[]string{"show", "--timeout", "500us", "f1"}, "outbox show: --timeout 500µs: want at least 1ms"},
		{[]string{"find", "--timeout", "0s"}, "outbox find: --timeout 0s: want at least 1ms"},
		{[]string{"console", "--timeout", "-1s"}, "outbox console: --timeout -1s: want at least 1ms"},
		{[]string{"--bogus", "stats"}, "outbox: flag provided but not defined: -bogus"},
		{[]string{"requeu", "--dry-run"}, `outbox: no command "requeu"`},
	} {
		out, err := b.run(t, c.args...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: exit %d, %v (%q); want exit status 2 and %q", strings.Join(c.args, " "), exitCode(err), err, out, c.want)
		}
		if strings.Contains(out, "DESCRIPTION:") {
			t.Errorf("%s: printed the whole help before the error:\n%s", strings.Join(c.args, " "), out)
		}
	}
	if s, _ := b.state(t, "f1"); s.Status != "FAILED" || s.Requeues != 0 {
		t.Errorf("f1 is %+v after refused commands, want FAILED and never requeued", s)
	}
}
