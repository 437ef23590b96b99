package main

import (
	"bytes"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/dev/devstack"
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
