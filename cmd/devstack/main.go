// Command devstack runs the real forwarder on an embedded stack: a local
// PostgreSQL cluster under .data/pg (kept for the next run), an in-process
// Kafka broker with both topics, a mock platform and a generator of camera
// events. It prints a progress line a second; Ctrl-C stops everything and
// exits 0. `make run` builds bin/forwarder and runs it.
//
// With -kafka-brokers it runs only the mock platform and the generator,
// against that Kafka and the PostgreSQL of -database-url (or DATABASE_URL),
// for a forwarder running elsewhere: the compose stack's devstack service
// (deploy/compose, docs/operations.md).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forwarder/forwarder/internal/dev/devstack"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/plural"
)

type envFlags map[string]string

func (e envFlags) String() string { return "" }

func (e envFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	e[k] = v
	return nil
}

func main() {
	os.Exit(run())
}

// options are the parsed command line.
type options struct {
	cfg      devstack.Config
	duration time.Duration
}

// parseFlags reads the command line; getenv supplies what external mode
// takes from the environment (secrets stay off the command line and out of
// the help text).
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) (options, error) {
	var (
		o       options
		cfg     = &o.cfg
		faults  mockplatform.Faults
		env     = envFlags{}
		verbose bool
		ext     devstack.External
		brokers string
	)
	fs.Float64Var(&cfg.Rate, "rate", 100, "camera messages per second (0: as fast as possible)")
	fs.Int64Var(&cfg.Count, "count", 0, "stop producing after this many messages (0: no limit)")
	fs.DurationVar(&o.duration, "duration", 0, "stop everything after this long (0: run until Ctrl-C)")
	fs.Float64Var(&cfg.DuplicateRate, "duplicates", 0.02, "share of messages that repeat an earlier one byte for byte")
	fs.Float64Var(&cfg.MalformedRate, "malformed", 0.01, "share of malformed messages (not JSON, bad inoutType, missing field, ...)")
	fs.Float64Var(&faults.Errcode998, "err998", 0.002, "share of platform answers with errcode 998 (do not resend: FAILED)")
	fs.Float64Var(&faults.Errcode999, "err999", 0.03, "share of platform answers with errcode 999 (busy: retried)")
	fs.Float64Var(&faults.HTTP5xx, "err5xx", 0.01, "share of platform answers with HTTP 500 (retried)")
	fs.DurationVar(&faults.Latency, "latency", 20*time.Millisecond, "platform latency")
	fs.DurationVar(&faults.LatencyJitter, "latency-jitter", 30*time.Millisecond, "random extra platform latency, up to this")
	fs.StringVar(&cfg.Dir, "data", devstack.DefaultDir, "state directory (PostgreSQL cluster in <data>/pg, forwarder.log)")
	fs.StringVar(&cfg.Forwarder, "forwarder", devstack.DefaultForwarder, "forwarder binary")
	fs.StringVar(&cfg.Pipeline, "config", devstack.DefaultPipeline, "pipeline config")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "", "forwarder HTTP server, for /metrics (default "+devstack.DefaultHTTPAddr+", or a free port)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "generator seed (0: random; runs on the same database need different seeds)")
	fs.Var(env, "e", "extra forwarder environment KEY=VALUE (repeatable), e.g. -e FORWARD_MAX_ATTEMPTS=3")
	fs.BoolVar(&verbose, "v", false, "also print the forwarder's log")
	fs.StringVar(&brokers, "kafka-brokers", "", "external mode (deploy/compose): run only the mock platform and the generator, producing to these Kafka brokers (comma-separated); "+
		"the database is -database-url, the platform's credentials PLATFORM_ACCESS_NAME and PLATFORM_ACCESS_PWD from the environment")
	fs.StringVar(&ext.DatabaseURL, "database-url", "", "external mode: the forwarder's PostgreSQL, for progress lines (default $DATABASE_URL)")
	fs.StringVar(&ext.PlatformAddr, "platform-addr", devstack.DefaultPlatformAddr, "external mode: where the mock platform listens")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./cmd/devstack [flags]\n\nRuns bin/forwarder on an embedded dev stack. Ctrl-C stops it.\n"+
			"With -kafka-brokers, serves only the mock platform and the generator for a forwarder running elsewhere.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	// The flag package reads no flag after the first argument: in
	// `devstack fast -rate 500` the -rate would be dropped unseen.
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: the dev stack takes flags only, e.g. make run ARGS=\"-rate 500\"", fs.Arg(0))
	}
	if err := checkFlags(o, faults); err != nil {
		return o, err
	}
	cfg.Faults, cfg.Env = faults, env
	if verbose {
		cfg.ForwarderLog = os.Stdout
	}
	if brokers != "" {
		for _, b := range strings.Split(brokers, ",") {
			if b = strings.TrimSpace(b); b != "" {
				ext.Brokers = append(ext.Brokers, b)
			}
		}
		if ext.DatabaseURL == "" {
			ext.DatabaseURL = getenv("DATABASE_URL")
		}
		ext.AccessName, ext.AccessPwd = getenv("PLATFORM_ACCESS_NAME"), getenv("PLATFORM_ACCESS_PWD")
		cfg.External = &ext
	}
	return o, nil
}

// checkFlags refuses a value the stack would refuse only once PostgreSQL,
// Kafka, the platform and the forwarder were started (a negative rate, a
// share above 1), or would run with unnoticed (a negative count or
// duration, NaN). The shares and latencies get the generator's and the
// platform's own checks, which name the flags.
func checkFlags(o options, f mockplatform.Faults) error {
	cfg := o.cfg
	if !(cfg.Rate >= 0) || math.IsInf(cfg.Rate, 1) {
		return fmt.Errorf("-rate %v: want messages per second, 0 for as fast as possible", cfg.Rate)
	}
	if cfg.Count < 0 {
		return fmt.Errorf("-count %d: want a number of messages, 0 for no limit", cfg.Count)
	}
	if o.duration < 0 {
		return fmt.Errorf("-duration %s: want a duration, 0 to run until Ctrl-C", o.duration)
	}
	flags := map[string]string{
		"DuplicateRate": "-duplicates", "MalformedRate": "-malformed",
		"Errcode998": "-err998", "Errcode999": "-err999", "HTTP5xx": "-err5xx",
		"Latency": "-latency", "LatencyJitter": "-latency-jitter",
	}
	flagOf := func(field string) string { return flags[field] }
	src := eventgen.SourceConfig{DuplicateRate: cfg.DuplicateRate, MalformedRate: cfg.MalformedRate}
	return cmp.Or(src.Validate(flagOf), f.Validate(flagOf))
}

func run() int {
	o, err := parseFlags(flag.CommandLine, os.Args[1:], os.Getenv)
	if err != nil {
		// flag.CommandLine reports its own errors and exits; the others
		// are ours.
		fmt.Fprintf(os.Stderr, "devstack: %v\n", err)
		return 2
	}
	cfg := o.cfg
	cfg.Logf = func(format string, args ...any) { fmt.Printf("devstack: "+format+"\n", args...) }

	// Ctrl-C goes to the terminal's foreground process group: make, go run
	// and us. Taking the foreground for ourselves means only we get it, stop
	// everything in order, and exit 0 - and so do go run and make.
	restore := takeForeground()
	defer restore()
	// When the reader of our output goes (make run | head), the next write
	// raises SIGPIPE, whose default action kills us and leaves PostgreSQL
	// running. Caught for good, it fails that write instead, and Run, whose
	// progress line it was, returns: everything stops in order, as on
	// Ctrl-C. The signal itself stops nothing: once caught it is raised by a
	// write to any closed connection too (the broker's reply to a Kafka
	// client that has hung up, the mock platform's to a forwarder that gave
	// up), which must not stop the stack.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopWithParent()

	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	s, err := devstack.Start(startCtx, cfg)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			fmt.Println("devstack: interrupted during start-up")
			return 0
		}
		fmt.Fprintf(os.Stderr, "devstack: %v\n", err)
		return 1
	}
	printBanner(os.Stdout, s, cfg)

	runErr := s.Run(ctx, o.duration, os.Stdout)
	// SIGTERM is caught for good before the context's handler goes: a dying
	// go run sends several within milliseconds, and one that came between
	// the two would kill us with the default action, PostgreSQL left running.
	keepStoppingOnSIGTERM()
	stop() // a second Ctrl-C during shutdown kills us the default way
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "devstack: %v\n", runErr)
	}
	if cfg.External != nil {
		fmt.Println("devstack: stopping the generator and the platform")
		final, _ := s.Progress(context.Background())
		if err := s.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "devstack: stopping: %v\n", err)
			return 1
		}
		printFinal(os.Stdout, final, s.Leftover, "the database keeps them")
	} else if code := stopEmbedded(s, runErr == nil); code != 0 {
		return code
	}
	if runErr != nil {
		return 1
	}
	return 0
}

// drainWithin bounds how long the stopping dev stack waits for the
// forwarder to read (persist and commit) what the generator produced.
const drainWithin = 10 * time.Second

// stopEmbedded stops the generator first and lets the forwarder read what
// it produced (the dev broker keeps nothing between runs), then the
// forwarder, whose in-flight requests finish, and reports this run's rows
// as the forwarder left them, before it stops the rest.
func stopEmbedded(s *devstack.Stack, drain bool) int {
	fmt.Println("devstack: stopping the generator; the forwarder (SIGTERM) once it has persisted what was produced; then Kafka, the platform and PostgreSQL")
	if err := s.StopGenerator(); err != nil {
		fmt.Fprintf(os.Stderr, "devstack: generator: %v\n", err)
	}
	// (A forwarder that stopped on its own, or none, persists nothing more.)
	drained := false
	if drain && s.Forwarder != nil {
		var p devstack.Progress
		if p, drained = s.Drain(context.Background(), drainWithin); !drained {
			fmt.Printf("devstack: after %s the forwarder has not read every message produced (%d rows persisted for %d messages): those still unread are dropped with the dev broker\n",
				drainWithin, p.Rows.Persisted, p.Produced.Rows())
		}
	}
	// What the stopping forwarder waits for, should it take a while.
	unfollow := s.Follow(os.Stdout)
	err := s.StopForwarders()
	unfollow()
	final, _ := s.Progress(context.Background())
	err = errors.Join(err, s.Stop())
	if err != nil {
		fmt.Fprintf(os.Stderr, "devstack: stopping: %v\n", err)
		return 1
	}
	kept := "the database keeps them"
	if s.PG != nil {
		kept = "the database stays in " + s.PG.Dir() + " for the next run"
	}
	printFinal(os.Stdout, final, s.Leftover, kept)
	if short := final.Produced.Rows() - final.Rows.Persisted; drained && short > 0 {
		// Every message was read: the missing rows are messages the
		// outbox took for redeliveries of an earlier run's rows.
		fmt.Printf("devstack: %d of the messages produced made no row: the outbox took them for redeliveries of an earlier run's rows (the same bytes at the same Kafka coordinates, as the dev broker's offsets start at 0 each run while the database stays; or, with a fixed -seed, the same messageIds)\n", short)
	}
	return 0
}

// printFinal says what this run produced and where its rows ended, and
// what the platform received, earlier runs' leftover rows included.
func printFinal(w io.Writer, p devstack.Progress, leftover int64, kept string) {
	r := p.Rows
	fmt.Fprintf(w, "devstack: stopped. %d produced (%s: duplicates add none), %d persisted: %d delivered, %d failed, %d to send; %s\n",
		p.Produced.Produced, plural.Count(p.Produced.Rows(), "row", "rows"), r.Persisted, r.Delivered, r.Failed, r.Waiting+r.Retrying+r.InProgress, kept)
	pl := p.Platform
	errs := pl.Errcode998 + pl.Errcode999 + pl.HTTP5xx + pl.Unavailable + pl.AuthFailures + pl.BadRequests
	fmt.Fprintf(w, "devstack: the platform accepted %d%s, answered %s and %s, at most %s at once\n",
		pl.Accepted, leftoverAmong(leftover), plural.Count(pl.Duplicates, "duplicate", "duplicates"),
		plural.Count(errs, "error", "errors"), plural.Count(pl.PeakInFlight, "request", "requests"))
}

// leftoverAmong names, after the platform's count of accepted requests,
// the rows of earlier runs it includes; "" when there are none.
func leftoverAmong(n int64) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" (among them the %s earlier runs left to send)", plural.Noun(n, "row", strconv.FormatInt(n, 10)+" rows"))
}

// leftoverBanner says that n > 0 rows of earlier runs will be sent too.
func leftoverBanner(n int64) string {
	return fmt.Sprintf("the database holds %s earlier runs left to send: %s sent too, and the platform's figures count %s (this run's progress does not)",
		plural.Count(n, "row", "rows"), plural.Noun(n, "it is", "they are"), plural.Noun(n, "it", "them"))
}

func printBanner(w io.Writer, s *devstack.Stack, cfg devstack.Config) {
	if s.Leftover > 0 {
		fmt.Fprintf(w, "devstack: %s\n", leftoverBanner(s.Leftover))
	}
	if cfg.External != nil {
		fmt.Fprintf(w, "devstack: mock platform on %s (PLATFORM_URL=http://<this host>:%s), accepting PLATFORM_ACCESS_NAME %q\n",
			s.Platform.Addr, portOf(s.Platform.Addr), cfg.External.AccessName)
		fmt.Fprintf(w, "devstack: generating %.0f msg/s to Kafka %s; progress read from the forwarder's database\n", cfg.Rate, strings.Join(s.Brokers, ","))
		return
	}
	fmt.Fprintf(w, "devstack: forwarder running (pid %d), log %s\n", s.Forwarder.Pid(), s.LogPath)
	fmt.Fprintf(w, "devstack: metrics  %s\n", s.Forwarder.MetricsURL())
	fmt.Fprintf(w, "devstack: database %s   (try: DATABASE_URL=%s bin/forwarder outbox stats)\n", s.DatabaseURL, s.DatabaseURL)
	fmt.Fprintf(w, "devstack: kafka    %s (group %s)   platform %s\n", strings.Join(s.Brokers, ","), devstack.Group, s.Platform.URL)
	fmt.Fprintf(w, "devstack: generating %.0f msg/s (%.0f%% duplicates, %.0f%% malformed); platform errors: %.1f%% errcode 999, %.1f%% HTTP 500, %.1f%% errcode 998\n",
		cfg.Rate, cfg.DuplicateRate*100, cfg.MalformedRate*100, cfg.Faults.Errcode999*100, cfg.Faults.HTTP5xx*100, cfg.Faults.Errcode998*100)
	fmt.Fprintln(w, "devstack: Ctrl-C stops everything")
}

func portOf(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return port
}
