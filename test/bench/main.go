// Command bench measures the forwarder end to end against three baselines,
// on one private PostgreSQL, one in-process Kafka broker (kfake) and a fast
// local mock platform, in one run (`make bench` runs it with -rounds 2):
//
//   - forwarder: the real bin/forwarder -c pipelines/forwarder.yaml as a
//     child process, with the documented environment (docs/configuration.md);
//   - forwarder-unordered: the same with ORDERING=off;
//   - naive: the textbook outbox forwarder, per message a transaction for
//     the insert, a POST and a transaction for the result, on 32 workers;
//   - batched: a hand-batched loop, per 500 messages one unnest insert, an
//     offset commit, 64 concurrent POSTs and one batch update;
//   - river: the same pipeline written with River, one job per message
//     inserted in the consumer's transaction, 64 River workers POSTing
//     (river.go, test/bench/riverbaseline).
//
// The baselines run as child processes too (this program re-executed with
// the hidden "baseline" subcommand, or the River baseline built from its own
// module), so that the CPU and memory of each consumer are measured the same
// way, from /proc, apart from the broker and the mock platform, which live in
// this process.
//
// For each scenario it measures the throughput on a Kafka backlog of -n
// messages (until every row is SUCCESS), then the produce→platform latency
// at a steady -rate, and prints a markdown table.
//
//	go run ./test/bench                                  # everything, 200 k messages, one round
//	go run ./test/bench -n 20000 -latency-duration 10s   # a quick run
//	go run ./test/bench -scenarios forwarder,forwarder-unordered -phases throughput -pprof /tmp/prof
//	go run ./test/bench -scenarios forwarder,batched -phases throughput -rounds 4   # medians of alternated rounds
//	go run ./test/bench -scenarios forwarder,forwarder-unordered -phases latency -latency-rounds 4
//	go run ./test/bench -set input.broker.inputs.1.outbox_retry.batch_size=500
//	go run ./test/bench scale -rows 10000000             # claim and gauge costs at 10 M rows
//	go run ./test/bench memory                           # peak RSS with 16 MiB messages
//	go run ./test/bench retention -rows 10000000         # retiring a day: drop vs row-by-row DELETE
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "baseline":
		err = runBaseline(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "scale":
		err = runScale(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "retention":
		err = runRetentionBench(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "memory":
		err = runMemory(ctx, os.Args[2:])
	default:
		err = runBench(ctx, os.Args[1:])
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// benchConfig is the command line of a bench run.
type benchConfig struct {
	N               int
	Scenarios       []string
	Phases          map[string]bool
	Rate            float64
	LatencyDuration time.Duration
	LatencyWarmup   time.Duration
	// LatencySamples, when set, is the path prefix of a file per scenario
	// with every measured message's send time and latency.
	LatencySamples string
	// LatencyTraces, with LatencySamples, traces a sample of the messages
	// of the forwarder's latency phases and writes the spans' times.
	LatencyTraces bool
	Partitions    int
	Forwarder     string
	Pipeline      string
	Sets          listFlag
	Env           listFlag
	// PGSets are extra PostgreSQL settings, name=value.
	PGSets       listFlag
	NaiveWorkers int
	BatchSize    int
	BatchPosts   int
	RiverWorkers int
	PprofDir     string
	PprofSeconds int
	Ceilings     bool
	WaitLoad     float64
	WaitLoadMax  time.Duration
	Dir          string
	Keep         bool
	Timeout      time.Duration
	Seed         uint64
	Durable      bool
	PGStatements bool
	Markdown     string
	LogLevel     string
	SelfProfile  string
	Root         string
	// Berths spreads the traffic over this many berths (0: 2 000).
	Berths int
	// Pooled runs the forwarder in the mode DATABASE_DIRECT_URL selects.
	Pooled bool
	// Previous is the checkout the forwarder-previous scenario runs.
	Previous string
	// Rounds is how many times the throughput phases run (roundOrder).
	Rounds int
	// LatencyRounds is how many times the latency phases run, alternated
	// the same way.
	LatencyRounds int
}

// roundOrder is the order of the scenarios' throughput phases in a round:
// as given in odd rounds, reversed in even ones, so that over two rounds
// each scenario runs as often early as late, and a drift of the machine's
// speed over the run weighs on each alike.
func roundOrder(scenarios []string, round int) []string {
	if round%2 == 1 {
		return scenarios
	}
	reversed := slices.Clone(scenarios)
	slices.Reverse(reversed)
	return reversed
}

func parseBenchFlags(args []string) (benchConfig, error) {
	var c benchConfig
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&c.N, "n", 200_000, "messages in the Kafka backlog of each throughput run")
	scenarios := fs.String("scenarios", "forwarder,forwarder-unordered,naive,batched,river", "scenarios to run, in order: forwarder, forwarder-unordered (ORDERING=off), naive, batched, river, forwarder-previous (-previous)")
	fs.IntVar(&c.Rounds, "rounds", 1, "run the throughput phases this many times, every other round in the reverse order, and report each ratio's median over the rounds: the machine's speed drifts by tens of per cent within minutes (docs/benchmarks.md)")
	fs.IntVar(&c.LatencyRounds, "latency-rounds", 1, "run the latency phases this many times, every other round in the reverse order, and report each latency's median over the rounds")
	fs.StringVar(&c.Previous, "previous", "", "a checkout of an earlier revision with bin/forwarder built, for the forwarder-previous scenario")
	fs.IntVar(&c.Berths, "berths", 5000, "berths the traffic is spread over, four per camera (the targets in docs/benchmarks.md are set at 5000; 0: 2000); see test/bench/ordering.go")
	phases := fs.String("phases", "throughput,latency", "phases to run for each scenario: throughput, latency")
	fs.Float64Var(&c.Rate, "rate", 2000, "messages per second of the latency phase")
	fs.DurationVar(&c.LatencyDuration, "latency-duration", 30*time.Second, "measured part of the latency phase")
	fs.DurationVar(&c.LatencyWarmup, "latency-warmup", 5*time.Second, "unmeasured start of the latency phase")
	fs.BoolVar(&c.LatencyTraces, "latency-traces", false, "with -latency-samples: trace one message in 20 of the forwarder's latency phases (TRACE_SAMPLE_RATIO=0.05; -env overrides it) and write each span's start and end to PREFIX.<scenario>.spans.tsv")
	fs.StringVar(&c.LatencySamples, "latency-samples", "", "write each measured message's send time and latency to `PREFIX`.<scenario>.tsv, and what PostgreSQL's backends wait for, every 50 ms, to PREFIX.<scenario>.activity.tsv")
	fs.IntVar(&c.Partitions, "partitions", 3, "partitions of each Kafka topic")
	fs.StringVar(&c.Forwarder, "forwarder", "bin/forwarder", "the forwarder binary (relative to the repository root)")
	fs.StringVar(&c.Pipeline, "pipeline", "pipelines/forwarder.yaml", "the forwarder's config (relative to the repository root)")
	fs.Var(&c.Sets, "set", "extra `path=value` passed to the forwarder as --set (repeatable), e.g. input.broker.inputs.1.outbox_retry.batch_size=500")
	fs.Var(&c.PGSets, "pg-set", "extra PostgreSQL `setting=value` for the bench's cluster (repeatable), e.g. session_preload_libraries=auto_explain with auto_explain.log_min_duration=40ms to log slow plans to the cluster's server.log (kept with -keep or -dir); reported with the results")
	fs.BoolVar(&c.Pooled, "pooled", false, "run the forwarder as behind a transaction pooler: DATABASE_DIRECT_URL set to its database too, so DATABASE_URL's statements are sent unnamed and planned at each execution (docs/deployment.md, PgBouncer); the mode's cost without PgBouncer's own hop")
	fs.Var(&c.Env, "env", "extra `KEY=VALUE` in the forwarder's environment (repeatable), e.g. FORWARD_MAX_IN_FLIGHT=200")
	fs.IntVar(&c.NaiveWorkers, "naive-workers", 32, "workers of the naive baseline")
	fs.IntVar(&c.BatchSize, "batch-size", 500, "batch size of the hand-batched baseline")
	fs.IntVar(&c.BatchPosts, "batch-posts", 64, "concurrent POSTs of the hand-batched baseline")
	fs.IntVar(&c.RiverWorkers, "river-workers", 64, "River workers (concurrent POSTs) of the River baseline; it inserts -batch-size records per transaction")
	fs.StringVar(&c.PprofDir, "pprof", "", "directory for CPU, heap and allocation profiles of the forwarder's first throughput run, with ordering on and off (<scenario>.cpu.pprof, …; enables http.debug_endpoints)")
	fs.IntVar(&c.PprofSeconds, "pprof-seconds", 10, "length of the CPU profile")
	fs.BoolVar(&c.Ceilings, "ceilings", true, "also measure the machine's ceilings: HTTP/1.1 loopback requests/s and unnest insert rows/s")
	fs.Float64Var(&c.WaitLoad, "wait-load", 0, "before measuring, wait until the 1-minute load average is below this (0: do not wait)")
	fs.DurationVar(&c.WaitLoadMax, "wait-load-max", 30*time.Minute, "give up waiting for the load after this long (and measure anyway)")
	fs.StringVar(&c.Dir, "dir", "", "work directory (PostgreSQL cluster, logs); default a new temporary directory")
	fs.BoolVar(&c.Keep, "keep", false, "keep the work directory and the scenario databases")
	fs.DurationVar(&c.Timeout, "timeout", 15*time.Minute, "limit for one phase of one scenario")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the message source")
	fs.BoolVar(&c.Durable, "durable", true, "run PostgreSQL with production durability: fsync, full_page_writes and synchronous_commit on; -durable=false turns fsync off as the tests do (labelled as such in the report)")
	fs.BoolVar(&c.PGStatements, "pg-statements", false, "load pg_stat_statements and print each scenario's top statements (calls per message)")
	fs.StringVar(&c.Markdown, "md", "", "also write the results as markdown to this file")
	fs.StringVar(&c.LogLevel, "log-level", "WARN", "the forwarder's LOG_LEVEL")
	fs.StringVar(&c.SelfProfile, "self-pprof", "", "write a CPU profile of this process (broker, mock platform, producers) to this file")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "":
		case scenarioForwarder, scenarioNaive, scenarioBatched, scenarioRiver, scenarioUnordered:
			c.Scenarios = append(c.Scenarios, s)
		case scenarioPrevious:
			if err := checkPrevious(c.Previous); err != nil {
				return c, err
			}
			scenarioTitles[scenarioPrevious] = previousTitle(c.Previous)
			c.Scenarios = append(c.Scenarios, s)
		default:
			return c, fmt.Errorf("-scenarios: unknown scenario %q (forwarder, naive, batched, river, forwarder-unordered, forwarder-previous)", s)
		}
	}
	c.Phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case "":
		case "throughput", "latency":
			c.Phases[p] = true
		default:
			return c, fmt.Errorf("-phases: unknown phase %q (throughput, latency)", p)
		}
	}
	for _, kv := range c.PGSets {
		if name, _, ok := strings.Cut(kv, "="); !ok || strings.TrimSpace(name) == "" {
			return c, fmt.Errorf("-pg-set %q: want setting=value", kv)
		}
	}
	if c.LatencyTraces && c.LatencySamples == "" {
		return c, errors.New("-latency-traces writes beside -latency-samples: set that too")
	}
	if c.N <= 0 || c.Rate <= 0 || c.Partitions <= 0 || c.Rounds <= 0 || c.LatencyRounds <= 0 {
		return c, errors.New("-n, -rate, -partitions, -rounds and -latency-rounds must be positive")
	}
	if c.Rounds > 1 && !c.Phases["throughput"] {
		return c, errors.New("-rounds repeats the throughput phases: add throughput to -phases")
	}
	if c.LatencyRounds > 1 && !c.Phases["latency"] {
		return c, errors.New("-latency-rounds repeats the latency phases: add latency to -phases")
	}
	root, err := repoRoot()
	if err != nil {
		return c, err
	}
	c.Root = root
	return c, nil
}

// repoRoot is the nearest directory at or above the working directory that
// holds go.mod: the forwarder runs there, its mapping paths being relative.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("no go.mod at or above %s: run the bench from the repository", dir)
		}
	}
}

func runBench(ctx context.Context, args []string) error {
	cfg, err := parseBenchFlags(args)
	if err != nil {
		return err
	}
	if cfg.WaitLoad > 0 {
		waitForLoad(ctx, cfg.WaitLoad, cfg.WaitLoadMax)
	}
	if cfg.SelfProfile != "" {
		f, err := os.Create(cfg.SelfProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	env, err := startEnv(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	if slices.Contains(cfg.Scenarios, scenarioRiver) {
		if err := env.buildRiver(ctx); err != nil {
			return err
		}
	}

	rep := &report{cfg: cfg, machine: describeMachine(env.serverVersion(ctx)), loadBefore: loadAvg()}
	if cfg.Ceilings {
		logf("measuring the ceilings")
		if rep.ceilings, err = measureCeilings(ctx, env); err != nil {
			return fmt.Errorf("measuring the ceilings: %w", err)
		}
	}
	if cfg.Phases["throughput"] {
		if err := env.prefill(ctx); err != nil {
			return err
		}
		for round := 1; round <= cfg.Rounds; round++ {
			for _, s := range roundOrder(cfg.Scenarios, round) {
				r, err := env.throughput(ctx, s, round)
				if err != nil {
					return fmt.Errorf("%s throughput: %w", s, err)
				}
				rep.throughput = append(rep.throughput, r)
				logf("%s: %.0f msgs/s (%d messages in %.1fs), consumer %.1f CPU s, %s peak RSS",
					s, r.MsgsPerSec, r.Messages, r.Window.Seconds(), r.Consumer.CPU, mib(r.Consumer.PeakRSS))
			}
		}
	}
	if cfg.Phases["latency"] {
		if cfg.Phases["throughput"] {
			if err := env.deleteTopics(ctx, env.vehicleTopic, env.heartbeatTopic); err != nil {
				return err
			}
		}
		for round := 1; round <= cfg.LatencyRounds; round++ {
			for _, s := range roundOrder(cfg.Scenarios, round) {
				r, err := env.latency(ctx, s, round)
				if err != nil {
					return fmt.Errorf("%s latency: %w", s, err)
				}
				rep.latency = append(rep.latency, r)
				logf("%s at %.0f msgs/s: p50 %s p99 %s max %s", s, cfg.Rate, ms(r.P50), ms(r.P99), ms(r.Max))
			}
		}
	}
	rep.loadAfter = loadAvg()
	out := rep.markdown() + orderingSummary(rep)
	fmt.Println()
	fmt.Println(out)
	if cfg.Markdown != "" {
		if err := os.WriteFile(cfg.Markdown, []byte(out), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", cfg.Markdown, err)
		}
	}
	return nil
}

// logf reports progress on stderr, so that stdout holds only the results.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s load %.2f  %s\n", time.Now().Format("15:04:05"), loadAvg(), fmt.Sprintf(format, args...))
}
