package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/testsupport/bigmsg"
)

// memoryConfig is the command line of `bench memory`.
type memoryConfig struct {
	Messages int
	Size     int
	Phases   []string
	Outage   time.Duration
	// PprofDir, when set, receives a heap profile of the forwarder taken
	// as its resident size reached its peak, per phase.
	PprofDir string
	bench    benchConfig
}

// Phases of `bench memory`.
const (
	phaseFlow   = "flow"   // the platform answers at once
	phaseOutage = "outage" // the platform hangs: the backlog builds in PostgreSQL
)

// memoryResult is one phase's measurement.
type memoryResult struct {
	Phase    string
	Messages int
	Size     int
	// PeakRSS is the forwarder's resident high-water mark (VmHWM) over
	// the whole phase; OutageRSS the highest resident size sampled while
	// the platform hung (the outage phase only).
	PeakRSS, OutageRSS int64
	// HeldMax is the most rows IN_PROGRESS sampled at once.
	HeldMax int
	// PeakInFlight is the platform's most concurrent requests.
	PeakInFlight int64
	CPU          float64
	Wall         time.Duration
	GoMemLimit   string
}

func parseMemoryFlags(args []string) (memoryConfig, error) {
	var c memoryConfig
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	fs.IntVar(&c.Messages, "messages", 100, "messages per phase")
	fs.IntVar(&c.Size, "size", bigmsg.Size, "bytes of each message (at most 16 MiB, the pipeline's max_payload_bytes; the default leaves room for the credentials in the request body, which the mock platform takes up to 16 MiB)")
	phases := fs.String("phases", phaseFlow+","+phaseOutage, "phases to run: flow (the platform answers at once), outage (the platform hangs until every message is in PostgreSQL and -outage has passed)")
	fs.DurationVar(&c.Outage, "outage", 30*time.Second, "least time the platform hangs in the outage phase")
	fs.IntVar(&c.bench.Partitions, "partitions", 3, "partitions of each Kafka topic")
	fs.StringVar(&c.bench.Forwarder, "forwarder", "bin/forwarder", "the forwarder binary (relative to the repository root)")
	fs.StringVar(&c.bench.Pipeline, "pipeline", "pipelines/forwarder.yaml", "the forwarder's config (relative to the repository root)")
	fs.Var(&c.bench.Sets, "set", "extra `path=value` passed to the forwarder as --set (repeatable)")
	fs.Var(&c.bench.Env, "env", "extra `KEY=VALUE` in the forwarder's environment (repeatable), e.g. GOMEMLIMIT=512MiB")
	fs.StringVar(&c.bench.Dir, "dir", "", "work directory (PostgreSQL cluster, logs); default a new temporary directory")
	fs.BoolVar(&c.bench.Keep, "keep", false, "keep the work directory")
	fs.StringVar(&c.PprofDir, "pprof", "", "directory for a heap profile of the forwarder at its peak resident size, per phase (enables http.debug_endpoints)")
	fs.DurationVar(&c.bench.Timeout, "timeout", 15*time.Minute, "limit for one phase")
	fs.StringVar(&c.bench.LogLevel, "log-level", "WARN", "the forwarder's LOG_LEVEL")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.Messages <= 0 || c.Size <= 0 || c.Size > bigmsg.MaxSize {
		return c, fmt.Errorf("-messages must be positive and -size in 1..%d", bigmsg.MaxSize)
	}
	for _, p := range strings.Split(*phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "":
		case phaseFlow, phaseOutage:
			c.Phases = append(c.Phases, p)
		default:
			return c, fmt.Errorf("-phases: unknown phase %q (flow, outage)", p)
		}
	}
	root, err := repoRoot()
	if err != nil {
		return c, err
	}
	c.bench.Root = root
	return c, nil
}

// runMemory streams large messages through the real forwarder and reports
// its peak resident memory: with the platform answering, and while the
// platform hangs so that every message waits in PostgreSQL
// (docs/configuration.md, "Memory").
func runMemory(ctx context.Context, args []string) error {
	cfg, err := parseMemoryFlags(args)
	if err != nil {
		return err
	}
	env, err := startEnv(ctx, cfg.bench,
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(2 * bigmsg.MaxSize)}))
	if err != nil {
		return err
	}
	defer env.close()

	var results []memoryResult
	for i, phase := range cfg.Phases {
		r, err := env.memoryPhase(ctx, cfg, phase, uint64(i+1))
		if err != nil {
			return fmt.Errorf("%s: %w", phase, err)
		}
		logf("%s: %d messages of %s, peak RSS %s", phase, r.Messages, mib(int64(r.Size)), mib(r.PeakRSS))
		results = append(results, r)
	}
	fmt.Println()
	fmt.Printf("Forwarder memory with %s messages (%s)\n\n", mib(int64(cfg.Size)), describeMachine(env.serverVersion(ctx)))
	fmt.Println("| phase | messages | peak RSS (VmHWM) | peak RSS while the platform hung | most rows IN_PROGRESS | platform peak in flight | forwarder CPU | wall | GOMEMLIMIT |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		outage := "–"
		if r.Phase == phaseOutage {
			outage = mib(r.OutageRSS)
		}
		fmt.Printf("| %s | %d | %s | %s | %d | %d | %.1f s | %.1f s | %s |\n",
			r.Phase, r.Messages, mib(r.PeakRSS), outage, r.HeldMax, r.PeakInFlight, r.CPU, r.Wall.Seconds(), r.GoMemLimit)
	}
	return nil
}

// memoryPhase runs one phase on a fresh database, topics, platform and
// forwarder process, so that the process's high-water mark is the phase's.
func (env *benchEnv) memoryPhase(ctx context.Context, cfg memoryConfig, phase string, seed uint64) (res memoryResult, err error) {
	res = memoryResult{Phase: phase, Messages: cfg.Messages, Size: cfg.Size, GoMemLimit: "100MiB (the binary's default)"}
	for _, kv := range cfg.bench.Env {
		if v, ok := strings.CutPrefix(kv, "GOMEMLIMIT="); ok {
			res.GoMemLimit = v
		}
	}
	if v := os.Getenv("GOMEMLIMIT"); v != "" && res.GoMemLimit == "100MiB (the binary's default)" {
		res.GoMemLimit = v
	}
	run := "mem_" + phase
	runCtx, dsn, pool, mp, done, err := env.prepareRun(ctx, run)
	if err != nil {
		return res, err
	}
	defer done()
	vehicle, heartbeat, err := env.createTopics(ctx, "mem-"+phase)
	if err != nil {
		return res, err
	}

	if phase == phaseOutage {
		mp.Hang()
	}
	start := time.Now()
	vars := env.consumerEnv(dsn, mp.URL, "bench-memory-"+phase, vehicle, heartbeat)
	c, err := env.startConsumer(runCtx, scenarioForwarder, run, vars, cfg.PprofDir != "")
	if err != nil {
		return res, err
	}
	defer c.Kill()
	startCPU, _ := readProcTimes(c.Pid())

	var onPeak func()
	if cfg.PprofDir != "" {
		file := filepath.Join(cfg.PprofDir, "forwarder.heap-"+phase+".pprof")
		onPeak = func() {
			if err := c.fetch(runCtx, "/debug/pprof/heap", file); err != nil {
				logf("%s: heap profile: %v", phase, err)
			}
		}
	}
	s := newRSSSampler(c.Pid(), onPeak)
	defer s.stop()
	go s.watchHeld(runCtx, pool)

	produced := make(chan error, 1)
	go func() { produced <- env.produceBig(runCtx, vehicle, heartbeat, cfg.Messages, cfg.Size, seed) }()

	if phase == phaseOutage {
		logf("%s: platform hanging; waiting for %d rows in PostgreSQL and at least %s", phase, cfg.Messages, cfg.Outage)
		if err := waitRows(runCtx, c, pool, cfg.Messages); err != nil {
			return res, err
		}
		if d := cfg.Outage - time.Since(start); d > 0 {
			select {
			case <-time.After(d):
			case <-runCtx.Done():
				return res, runCtx.Err()
			}
		}
		res.OutageRSS = s.peak()
		logf("%s: %d rows in PostgreSQL, peak RSS so far %s; releasing the platform", phase, cfg.Messages, mib(res.OutageRSS))
		mp.Release()
	}
	if err := <-produced; err != nil {
		return res, err
	}
	if err := waitAllSuccess(runCtx, c, mp, pool, outboxProgress, cfg.Messages, phase); err != nil {
		return res, err
	}
	res.Wall = time.Since(start)
	if v, err := statusKB(fmt.Sprintf("/proc/%d/status", c.Pid()), "VmHWM"); err == nil {
		res.PeakRSS = v
	}
	if t, err := readProcTimes(c.Pid()); err == nil {
		res.CPU = t.own() - startCPU.own()
	}
	res.HeldMax = s.heldMax()
	res.PeakInFlight = mp.Stats().PeakInFlight
	if err := c.stop(45 * time.Second); err != nil {
		logf("%s: stopping: %v", phase, err)
	}
	return res, nil
}

// produceBig writes n vehicle events of size bytes each.
func (env *benchEnv) produceBig(ctx context.Context, vehicle, heartbeat string, n, size int, seed uint64) error {
	src, err := eventgen.NewSource(eventgen.SourceConfig{VehicleTopic: vehicle, HeartbeatTopic: heartbeat, Seed: seed})
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.kafka.ListenAddrs()...),
		kgo.ProducerBatchMaxBytes(2*bigmsg.MaxSize), kgo.BrokerMaxWriteBytes(4*bigmsg.MaxSize),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.MaxBufferedBytes(4*bigmsg.MaxSize))
	if err != nil {
		return err
	}
	defer cl.Close()
	for range n {
		m, err := bigmsg.Vehicle(src, size)
		if err != nil {
			return err
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}).FirstErr(); err != nil {
			return fmt.Errorf("producing a %d-byte message: %w", size, err)
		}
	}
	return nil
}

// waitRows waits until the outbox holds n messages.
func waitRows(ctx context.Context, c *child, pool *pgxpool.Pool, n int) error {
	for {
		if err := c.exited(); err != nil {
			return err
		}
		var rows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_messages`).Scan(&rows); err != nil {
			return err
		}
		if rows >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d rows (%d so far): %w", n, rows, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rssSampler follows a process's resident size every 100 ms (VmHWM gives
// the exact peak; the samples say when it happened) and the rows held.
type rssSampler struct {
	pid  int
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	max     int64
	maxHeld int
}

// newRSSSampler starts sampling pid. onPeak, when set, runs each time the
// resident size passes its previous peak by 32 MiB.
func newRSSSampler(pid int, onPeak func()) *rssSampler {
	s := &rssSampler{pid: pid, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var profiled int64
		for {
			if v, err := statusKB(fmt.Sprintf("/proc/%d/status", pid), "VmRSS"); err == nil {
				s.mu.Lock()
				s.max = max(s.max, v)
				s.mu.Unlock()
				if onPeak != nil && v > profiled+32<<20 {
					profiled = v
					onPeak()
				}
			}
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) peak() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

func (s *rssSampler) heldMax() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxHeld
}

// watchHeld samples the rows IN_PROGRESS until the sampler stops.
func (s *rssSampler) watchHeld(ctx context.Context, pool *pgxpool.Pool) {
	for {
		var held int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_deliveries WHERE status = 'IN_PROGRESS'`).Scan(&held); err == nil {
			s.mu.Lock()
			s.maxHeld = max(s.maxHeld, held)
			s.mu.Unlock()
		}
		select {
		case <-s.done:
			return
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (s *rssSampler) stop() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.wg.Wait()
}
