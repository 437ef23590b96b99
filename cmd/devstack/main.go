// Command devstack runs the real forwarder on an embedded stack: a local
// PostgreSQL cluster under .data/pg (kept for the next run), an in-process
// Kafka broker with both topics, a mock platform and a generator of camera
// events. It prints a progress line a second; Ctrl-C stops everything and
// exits 0. `make run` builds bin/forwarder and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/forwarder/forwarder/internal/dev/devstack"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
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

func run() int {
	var (
		cfg     devstack.Config
		faults  mockplatform.Faults
		env     = envFlags{}
		verbose bool
	)
	flag.Float64Var(&cfg.Rate, "rate", 100, "camera messages per second (0: as fast as possible)")
	flag.Int64Var(&cfg.Count, "count", 0, "stop producing after this many messages (0: no limit)")
	duration := flag.Duration("duration", 0, "stop everything after this long (0: run until Ctrl-C)")
	flag.Float64Var(&cfg.DuplicateRate, "duplicates", 0.02, "share of messages that repeat an earlier one byte for byte")
	flag.Float64Var(&cfg.MalformedRate, "malformed", 0.01, "share of malformed messages (not JSON, bad inoutType, missing field, ...)")
	flag.Float64Var(&faults.Errcode998, "err998", 0.002, "share of platform answers with errcode 998 (do not resend: FAILED)")
	flag.Float64Var(&faults.Errcode999, "err999", 0.03, "share of platform answers with errcode 999 (busy: retried)")
	flag.Float64Var(&faults.HTTP5xx, "err5xx", 0.01, "share of platform answers with HTTP 500 (retried)")
	flag.DurationVar(&faults.Latency, "latency", 20*time.Millisecond, "platform latency")
	flag.DurationVar(&faults.LatencyJitter, "latency-jitter", 30*time.Millisecond, "random extra platform latency, up to this")
	flag.StringVar(&cfg.Dir, "data", devstack.DefaultDir, "state directory (PostgreSQL cluster in <data>/pg, forwarder.log)")
	flag.StringVar(&cfg.Forwarder, "forwarder", devstack.DefaultForwarder, "forwarder binary")
	flag.StringVar(&cfg.Pipeline, "config", devstack.DefaultPipeline, "pipeline config")
	flag.StringVar(&cfg.HTTPAddr, "http-addr", "", "forwarder HTTP server, for /metrics (default "+devstack.DefaultHTTPAddr+", or a free port)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "generator seed (0: random; runs on the same database need different seeds)")
	flag.Var(env, "e", "extra forwarder environment KEY=VALUE (repeatable), e.g. -e FORWARD_MAX_ATTEMPTS=3")
	flag.BoolVar(&verbose, "v", false, "also print the forwarder's log")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./cmd/devstack [flags]\n\nRuns bin/forwarder on an embedded dev stack. Ctrl-C stops it.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	cfg.Faults, cfg.Env = faults, env
	if verbose {
		cfg.ForwarderLog = os.Stdout
	}
	cfg.Logf = func(format string, args ...any) { fmt.Printf("devstack: "+format+"\n", args...) }

	// Ctrl-C goes to the terminal's foreground process group: make, go run
	// and us. Taking the foreground for ourselves means only we get it, stop
	// everything in order, and exit 0 - and so do go run and make.
	restore := takeForeground()
	defer restore()
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

	runErr := s.Run(ctx, *duration, os.Stdout)
	stop() // a second Ctrl-C during shutdown kills us the default way
	keepStoppingOnSIGTERM()
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "devstack: %v\n", runErr)
	}
	fmt.Println("devstack: stopping the forwarder (SIGTERM), the generator, Kafka, the platform and PostgreSQL")
	final, _ := s.Progress(context.Background())
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "devstack: stopping: %v\n", err)
		return 1
	}
	fmt.Printf("devstack: stopped. %d produced, %d persisted, %d delivered, %d failed; the database stays in %s for the next run\n",
		final.Produced.Produced, final.Rows.Persisted, final.Rows.Delivered, final.Rows.Failed, s.PG.Dir())
	if runErr != nil {
		return 1
	}
	return 0
}

func printBanner(w io.Writer, s *devstack.Stack, cfg devstack.Config) {
	fmt.Fprintf(w, "devstack: forwarder running (pid %d), log %s\n", s.Forwarder.Pid(), s.LogPath)
	fmt.Fprintf(w, "devstack: metrics  %s\n", s.Forwarder.MetricsURL())
	fmt.Fprintf(w, "devstack: database %s   (try: DATABASE_URL=%s bin/forwarder outbox stats)\n", s.DatabaseURL, s.DatabaseURL)
	fmt.Fprintf(w, "devstack: kafka    %s   platform %s\n", strings.Join(s.Brokers, ","), s.Platform.URL)
	fmt.Fprintf(w, "devstack: generating %.0f msg/s (%.0f%% duplicates, %.0f%% malformed); platform errors: %.1f%% errcode 999, %.1f%% HTTP 500, %.1f%% errcode 998\n",
		cfg.Rate, cfg.DuplicateRate*100, cfg.MalformedRate*100, cfg.Faults.Errcode999*100, cfg.Faults.HTTP5xx*100, cfg.Faults.Errcode998*100)
	fmt.Fprintln(w, "devstack: Ctrl-C stops everything")
}
