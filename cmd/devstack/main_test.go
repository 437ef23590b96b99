package main

import (
	"bytes"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/dev/devstack"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

func TestParseFlags(t *testing.T) {
	env := map[string]string{
		"DATABASE_URL":         "postgres://forwarder:db-secret@postgres:5432/forwarder",
		"PLATFORM_ACCESS_NAME": "compose",
		"PLATFORM_ACCESS_PWD":  "platform-secret",
	}
	parse := func(t *testing.T, args ...string) options {
		t.Helper()
		fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o, err := parseFlags(fs, args, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return o
	}

	t.Run("DefaultIsTheEmbeddedStack", func(t *testing.T) {
		// `make run`: everything embedded, the forwarder started as a child.
		o := parse(t)
		if o.cfg.External != nil || o.cfg.NoForwarder || o.cfg.NoGenerator {
			t.Fatalf("without flags: External %+v, NoForwarder %v, NoGenerator %v; want the embedded stack with its forwarder",
				o.cfg.External, o.cfg.NoForwarder, o.cfg.NoGenerator)
		}
		if o.cfg.Dir != devstack.DefaultDir || o.cfg.Forwarder != devstack.DefaultForwarder || o.cfg.Pipeline != devstack.DefaultPipeline || o.cfg.Rate != 100 {
			t.Fatalf("defaults changed: %+v", o.cfg)
		}
	})

	t.Run("KafkaBrokersSelectExternalMode", func(t *testing.T) {
		o := parse(t, "-kafka-brokers", "redpanda:9092, other:9092", "-platform-addr", "0.0.0.0:8080", "-rate", "20")
		want := &devstack.External{
			Brokers:      []string{"redpanda:9092", "other:9092"},
			DatabaseURL:  env["DATABASE_URL"],
			PlatformAddr: "0.0.0.0:8080",
			AccessName:   "compose",
			AccessPwd:    "platform-secret",
		}
		if !reflect.DeepEqual(o.cfg.External, want) || o.cfg.Rate != 20 {
			t.Fatalf("external config %+v (rate %v), want %+v", o.cfg.External, o.cfg.Rate, want)
		}
		o = parse(t, "-kafka-brokers", "k:9092", "-database-url", "postgres://elsewhere/db")
		if o.cfg.External.DatabaseURL != "postgres://elsewhere/db" || o.cfg.External.PlatformAddr != devstack.DefaultPlatformAddr {
			t.Fatalf("-database-url or the platform address default not taken: %+v", o.cfg.External)
		}
	})

	t.Run("AnArgumentIsRefused", func(t *testing.T) {
		// Flags after it would be read as arguments too, and dropped.
		fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		_, err := parseFlags(fs, []string{"fast", "-rate", "500"}, func(k string) string { return env[k] })
		if err == nil || !strings.Contains(err.Error(), `unexpected argument "fast"`) {
			t.Fatalf("devstack fast -rate 500: %v, want the argument refused", err)
		}
	})

	// Each was refused only once PostgreSQL, Kafka, the platform and the
	// forwarder had started, or ran unnoticed (a negative count, NaN); the
	// smallest and largest values accepted start.
	t.Run("ValuesTheStackCannotUseAreRefused", func(t *testing.T) {
		for args, want := range map[string]string{
			"-rate -5":                            "-rate -5: want messages per second, 0 for as fast as possible",
			"-rate NaN":                           "-rate NaN: want messages per second",
			"-rate +Inf":                          "-rate +Inf: want messages per second",
			"-count -1":                           "-count -1: want a number of messages, 0 for no limit",
			"-duration -1s":                       "-duration -1s: want a duration, 0 to run until Ctrl-C",
			"-latency -1ms":                       "-latency -1ms, -latency-jitter 30ms: a latency is not negative",
			"-latency-jitter -1s":                 "-latency 20ms, -latency-jitter -1s: a latency is not negative",
			"-duplicates 2":                       "-duplicates 2: want a share from 0 to 1",
			"-malformed -0.1":                     "-malformed -0.1: want a share from 0 to 1",
			"-duplicates NaN":                     "-duplicates NaN: want a share from 0 to 1",
			"-err5xx 1.5":                         "-err5xx 1.5: want a share from 0 to 1",
			"-duplicates 0.6 -malformed 0.6":      "-duplicates and -malformed add up to 1.2, more than every message",
			"-err998 0.5 -err999 0.5 -err5xx 0.5": "-err998, -err999 and -err5xx add up to 1.5, more than every answer",
		} {
			fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			_, err := parseFlags(fs, strings.Fields(args), func(k string) string { return env[k] })
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("%s: %v, want %q", args, err, want)
			}
		}
		parse(t, "-rate", "0", "-count", "0", "-duration", "0s", "-latency", "0s", "-latency-jitter", "0s",
			"-duplicates", "0", "-malformed", "0", "-err998", "0", "-err999", "0", "-err5xx", "0")
		parse(t, "-duplicates", "1", "-malformed", "0", "-err998", "0", "-err999", "0", "-err5xx", "1")
	})

	t.Run("HelpShowsNoSecret", func(t *testing.T) {
		fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
		var help bytes.Buffer
		fs.SetOutput(&help)
		if _, err := parseFlags(fs, []string{"-h"}, func(k string) string { return env[k] }); err != flag.ErrHelp {
			t.Fatalf("-h: %v", err)
		}
		for _, secret := range []string{"db-secret", "platform-secret"} {
			if strings.Contains(help.String(), secret) {
				t.Errorf("the help text shows %q from the environment:\n%s", secret, help.String())
			}
		}
		if !strings.Contains(help.String(), "-kafka-brokers") {
			t.Errorf("the help text does not document -kafka-brokers:\n%s", help.String())
		}
	})
}

// TestLeftoverWording: the lines about rows earlier runs left say "row" for
// one and the count for more, and the platform's line names none when
// there are none.
func TestLeftoverWording(t *testing.T) {
	for _, c := range []struct {
		n             int64
		among, banner string
	}{
		{0, "", ""},
		{1, " (among them the row earlier runs left to send)",
			"the database holds 1 row earlier runs left to send: it is sent too, and the platform's figures count it (this run's progress does not)"},
		{6, " (among them the 6 rows earlier runs left to send)",
			"the database holds 6 rows earlier runs left to send: they are sent too, and the platform's figures count them (this run's progress does not)"},
	} {
		if got := leftoverAmong(c.n); got != c.among {
			t.Errorf("leftoverAmong(%d) = %q, want %q", c.n, got, c.among)
		}
		if c.n == 0 {
			continue
		}
		if got := leftoverBanner(c.n); got != c.banner {
			t.Errorf("leftoverBanner(%d) = %q, want %q", c.n, got, c.banner)
		}
	}
}

// TestFinalLinesCountInEnglish: the lines printed when the dev stack stops
// say "1 row", "1 error", "1 request" for one and the plural for more.
func TestFinalLinesCountInEnglish(t *testing.T) {
	one := devstack.Progress{
		Produced: eventgen.Stats{Produced: 2, Deliverable: 1},
		Rows:     outboxdb.Progress{Persisted: 1, Delivered: 1},
		Platform: mockplatform.Stats{Accepted: 1, Duplicates: 1, HTTP5xx: 1, PeakInFlight: 1},
	}
	var b bytes.Buffer
	printFinal(&b, one, 0, "kept")
	want := "devstack: stopped. 2 produced (1 row: duplicates add none), 1 persisted: 1 delivered, 0 failed, 0 to send; kept\n" +
		"devstack: the platform accepted 1, answered 1 duplicate and 1 error, at most 1 request at once\n"
	if b.String() != want {
		t.Errorf("for one of each, printed\n%s\nwant\n%s", b.String(), want)
	}

	more := devstack.Progress{
		Produced: eventgen.Stats{Produced: 9, Deliverable: 5, Malformed: 2},
		Rows:     outboxdb.Progress{Persisted: 7, Delivered: 4, Failed: 2, Waiting: 1},
		Platform: mockplatform.Stats{Accepted: 10, Duplicates: 0, Errcode998: 1, Unavailable: 2, PeakInFlight: 3},
	}
	b.Reset()
	printFinal(&b, more, 6, "kept")
	want = "devstack: stopped. 9 produced (7 rows: duplicates add none), 7 persisted: 4 delivered, 2 failed, 1 to send; kept\n" +
		"devstack: the platform accepted 10 (among them the 6 rows earlier runs left to send), answered 0 duplicates and 3 errors, at most 3 requests at once\n"
	if b.String() != want {
		t.Errorf("for several, printed\n%s\nwant\n%s", b.String(), want)
	}
}
