// Package devstack runs the forwarder on an embedded stack, for `make run`,
// the smoke test and the end-to-end tests: a PostgreSQL cluster of its own
// (internal/dev/pgcluster, kept under Dir/pg and reused by the next run), an
// in-process Kafka broker (franz-go's kfake) with both topics, the mock
// platform (internal/dev/mockplatform), the event generator (internal/dev/eventgen),
// and the real bin/forwarder -c pipelines/forwarder.yaml as a child process,
// with the environment of pipelines/forwarder.yaml pointing at all of them.
// With Config.External it runs only the mock platform and the generator,
// against a Kafka and a PostgreSQL that run elsewhere (deploy/compose).
//
//	s, err := devstack.Start(ctx, devstack.Config{Rate: 100})
//	...
//	err = s.Run(ctx, 0, os.Stdout) // a progress line a second until ctx ends
//	err = s.Stop()
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Defaults of Config.
const (
	DefaultDir             = ".data"
	DefaultForwarder       = "bin/forwarder"
	DefaultPipeline        = "pipelines/forwarder.yaml"
	DefaultHTTPAddr        = "127.0.0.1:4195"
	DefaultDatabase        = "forwarder"
	DefaultAccessName      = "devstack"
	DefaultShutdownTimeout = 40 * time.Second
	// KafkaPartitions is the partition count of both topics.
	KafkaPartitions = 3
	// DeadLetterTopic is the topic of pipelines/examples/dead_letter.yaml,
	// created so that the example can be run against the stack.
	DeadLetterTopic = "forwarder-dead-letter"
	// Group is the stack's consumer group: not the pipeline's default
	// "forwarder", so that a forwarder started by hand with the defaults
	// does not join it and take partitions from the stack's.
	Group = "forwarder-devstack"
)

// Config configures a Stack. Zero values pick the defaults.
type Config struct {
	// Dir holds the stack's state: pg/ (the PostgreSQL cluster, reused by
	// the next run) and forwarder.log. Default DefaultDir.
	Dir string
	// WorkDir is the directory the forwarder runs in (mappings/ paths are
	// relative to it) and Forwarder and Pipeline are relative to. Default ".".
	WorkDir string
	// Forwarder is the binary, Pipeline its config.
	Forwarder, Pipeline string

	// Generator: messages per second (0: as fast as Kafka takes them),
	// how many in all (0: no limit), and the share of duplicates and
	// malformed messages. NoGenerator leaves Kafka empty.
	Rate                         float64
	Count                        int64
	DuplicateRate, MalformedRate float64
	Seed                         uint64
	NoGenerator                  bool

	// Faults the mock platform injects.
	Faults mockplatform.Faults

	// HTTPAddr is the forwarder's HTTP server (/metrics). Default
	// DefaultHTTPAddr, or a free port when that one is taken; port 0 picks a
	// free port.
	HTTPAddr string
	// Env overrides or adds to the forwarder's environment (for example
	// FORWARD_MAX_ATTEMPTS). The stack sets the documented variables, and
	// FORWARD_RETRY_INITIAL=1s and FORWARD_RETRY_MAX=30s so retries show.
	Env map[string]string
	// NoForwarder starts everything but the forwarder (see StartForwarder).
	NoForwarder bool
	// ForwarderLog also receives the forwarder's output, which always goes
	// to Dir/forwarder.log.
	ForwarderLog io.Writer
	// ShutdownTimeout bounds the forwarder's exit after SIGTERM (default
	// DefaultShutdownTimeout, above Benthos's 20 s shutdown_timeout).
	ShutdownTimeout time.Duration
	// Logf reports what the stack is doing (default: nothing).
	Logf func(format string, args ...any)

	// External, when set, runs only the mock platform and the generator,
	// against a Kafka and a PostgreSQL that run elsewhere (the compose stack
	// in deploy/compose): no embedded PostgreSQL or broker, no forwarder
	// child, nothing written under Dir. The forwarder fields are ignored.
	External *External
}

// Stack is a running dev stack.
type Stack struct {
	cfg Config

	// PG is the PostgreSQL cluster, Kafka the broker, Platform the mock
	// platform, Generator the event generator (nil with NoGenerator).
	PG        *pgcluster.Cluster
	Kafka     *kfake.Cluster
	Platform  *mockplatform.Server
	Generator *eventgen.Generator
	// Forwarder is the stack's forwarder (nil with NoForwarder).
	Forwarder *Forwarder

	// DatabaseURL and Brokers are what the forwarder is given.
	DatabaseURL string
	Brokers     []string
	// LogPath is the forwarder's log file.
	LogPath string
	// Leftover is how many rows earlier runs left to send (PENDING or
	// IN_PROGRESS when this run started): the forwarder sends them too, and
	// the platform's counts include them while this run's progress does not.
	Leftover int64

	pool      *pgxpool.Pool
	mark      int64 // the last record id before this run
	accessPwd string
	env       map[string]string
	logFile   *os.File
	lock      *os.File // the directory's lock (lockDir), held until Stop

	genCancel context.CancelFunc
	genDone   chan struct{}
	genErr    error

	// events are what the forwarders did that the screen shows (Run,
	// Follow), read from their logs.
	events chan Event

	mu                sync.Mutex
	forwarders        []*Forwarder
	forwardersStopped bool
	stopped           bool
}

// Start brings the stack up. On error, whatever had started is stopped.
func Start(ctx context.Context, cfg Config) (s *Stack, err error) {
	cfg.Dir = orDefault(cfg.Dir, DefaultDir)
	cfg.WorkDir = orDefault(cfg.WorkDir, ".")
	cfg.Forwarder = orDefault(cfg.Forwarder, DefaultForwarder)
	cfg.Pipeline = orDefault(cfg.Pipeline, DefaultPipeline)
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.External != nil {
		return startExternal(ctx, cfg)
	}
	if cfg.WorkDir, err = filepath.Abs(cfg.WorkDir); err != nil {
		return nil, err
	}
	if cfg.Dir, err = filepath.Abs(resolve(cfg.WorkDir, cfg.Dir)); err != nil {
		return nil, err
	}
	cfg.Forwarder = resolve(cfg.WorkDir, cfg.Forwarder)
	if !cfg.NoForwarder {
		if _, err := os.Stat(cfg.Forwarder); err != nil {
			return nil, fmt.Errorf("forwarder binary %s not found (run make build): %w", cfg.Forwarder, err)
		}
		if _, err := os.Stat(resolve(cfg.WorkDir, cfg.Pipeline)); err != nil {
			return nil, fmt.Errorf("pipeline %s not found: %w", cfg.Pipeline, err)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", cfg.Dir, err)
	}

	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s = &Stack{cfg: cfg, LogPath: filepath.Join(cfg.Dir, "forwarder.log"), lock: lock, events: make(chan Event, eventBuffer)}
	defer func() {
		if err != nil {
			_ = s.Stop()
			s = nil
		}
	}()

	cfg.Logf("starting PostgreSQL in %s", filepath.Join(cfg.Dir, "pg"))
	pgDir := filepath.Join(cfg.Dir, "pg")
	if s.PG, err = pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir}); err != nil {
		if _, perr := os.Stat(filepath.Join(pgDir, "postmaster.pid")); perr == nil {
			// A run that was killed (not stopped) leaves its server running.
			err = fmt.Errorf("%w\na PostgreSQL server from an earlier run may still be running in %s; stop it with:\n  %s",
				err, pgDir, stopHint(pgDir))
		}
		return s, err
	}
	if s.DatabaseURL, err = ensureDatabase(ctx, s.PG, DefaultDatabase); err != nil {
		return s, err
	}
	if s.pool, err = outboxdb.Open(ctx, s.DatabaseURL, outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-devstack"}); err != nil {
		return s, err
	}
	if err = s.markStart(ctx); err != nil {
		return s, err
	}

	if s.Kafka, err = kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(KafkaPartitions, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic),
		// For pipelines/examples/dead_letter.yaml (docs/operations.md).
		kfake.SeedTopics(1, DeadLetterTopic),
		// Let the forwarder pick a short session timeout (fast rebalances).
		kfake.GroupMinSessionTimeout(time.Second),
	); err != nil {
		return s, fmt.Errorf("starting the Kafka broker: %w", err)
	}
	s.Brokers = s.Kafka.ListenAddrs()
	cfg.Logf("Kafka broker on %s, topics %s and %s (%d partitions each), and %s for the dead-letter example", strings.Join(s.Brokers, ","),
		eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic, KafkaPartitions, DeadLetterTopic)

	if s.accessPwd, err = randomHex(16); err != nil {
		return s, err
	}
	if s.Platform, err = mockplatform.Start(mockplatform.Config{
		AccessName: DefaultAccessName, AccessPwd: s.accessPwd, Faults: cfg.Faults,
	}); err != nil {
		return s, err
	}
	cfg.Logf("mock platform on %s", s.Platform.URL)

	s.env = map[string]string{
		"KAFKA_BROKERS":         strings.Join(s.Brokers, ","),
		"KAFKA_GROUP":           Group,
		"KAFKA_TOPIC_VEHICLE":   eventgen.DefaultVehicleTopic,
		"KAFKA_TOPIC_HEARTBEAT": eventgen.DefaultHeartbeatTopic,
		"DATABASE_URL":          s.DatabaseURL,
		"PLATFORM_URL":          s.Platform.URL,
		"PLATFORM_ACCESS_NAME":  DefaultAccessName,
		"PLATFORM_ACCESS_PWD":   s.accessPwd,
		"FORWARD_RETRY_INITIAL": "1s",
		"FORWARD_RETRY_MAX":     "30s",
	}
	for k, v := range cfg.Env {
		s.env[k] = v
	}

	if s.logFile, err = os.Create(s.LogPath); err != nil {
		return s, fmt.Errorf("creating the forwarder log: %w", err)
	}
	if !cfg.NoForwarder {
		addr := cfg.HTTPAddr
		if addr == "" {
			addr = DefaultHTTPAddr
			if !childproc.AddrFree(addr) {
				addr = ""
			}
		}
		cfg.Logf("starting %s -c %s (log: %s)", cfg.Forwarder, cfg.Pipeline, s.LogPath)
		if s.Forwarder, err = s.StartForwarder(ctx, ForwarderOptions{HTTPAddr: addr}); err != nil {
			return s, fmt.Errorf("%w\nlast lines of %s:\n%s", err, s.LogPath, childproc.TailFile(s.LogPath, 3000))
		}
	}

	return s, s.startGenerator(ctx)
}

// startGenerator starts producing to s.Brokers unless NoGenerator is set.
func (s *Stack) startGenerator(ctx context.Context) error {
	cfg := s.cfg
	if cfg.NoGenerator {
		return nil
	}
	var err error
	if s.Generator, err = eventgen.New(eventgen.Config{
		SourceConfig: eventgen.SourceConfig{DuplicateRate: cfg.DuplicateRate, MalformedRate: cfg.MalformedRate, Seed: cfg.Seed},
		Brokers:      s.Brokers,
		Rate:         cfg.Rate,
		Count:        cfg.Count,
	}); err != nil {
		return err
	}
	genCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.genCancel, s.genDone = cancel, make(chan struct{})
	go func() {
		defer close(s.genDone)
		s.genErr = s.Generator.Run(genCtx)
	}()
	return nil
}

// StartForwarder starts one more forwarder against the stack (the stack's
// own is started by Start). Its output goes to the stack's log; Stop stops
// it if it is still running.
func (s *Stack) StartForwarder(ctx context.Context, opts ForwarderOptions) (*Forwarder, error) {
	var logs io.Writer = s.logFile
	if s.cfg.ForwarderLog != nil {
		logs = io.MultiWriter(s.logFile, s.cfg.ForwarderLog)
	}
	if opts.Log != nil {
		logs = io.MultiWriter(logs, opts.Log)
	}
	opts.Log = io.MultiWriter(logs, &logWatcher{s: s})
	f, err := startForwarder(ctx, s.cfg.Forwarder, s.cfg.Pipeline, s.cfg.WorkDir, s.env, opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.forwarders = append(s.forwarders, f)
	s.mu.Unlock()
	return f, nil
}

// Env is the environment the forwarders get, PLATFORM_ACCESS_PWD left out.
func (s *Stack) Env() map[string]string {
	out := map[string]string{}
	for k, v := range s.env {
		if k != "PLATFORM_ACCESS_PWD" {
			out[k] = v
		}
	}
	return out
}

// Pool is a connection pool on the stack's database.
func (s *Stack) Pool() *pgxpool.Pool { return s.pool }

// StopGenerator stops the generator and waits for it; its error, if any,
// is returned. Safe to call more than once.
func (s *Stack) StopGenerator() error {
	if s.genCancel == nil {
		return nil
	}
	s.genCancel()
	s.genCancel = nil
	<-s.genDone
	return s.genErr
}

// StopForwarders stops the stack's forwarders (SIGTERM, then waits) and
// reports the first that did not exit cleanly; the rest of the stack runs
// on, so that what they left can be read. Stop calls it too.
func (s *Stack) StopForwarders() error {
	s.mu.Lock()
	if s.forwardersStopped {
		s.mu.Unlock()
		return nil
	}
	s.forwardersStopped = true
	fwds := s.forwarders
	s.mu.Unlock()
	var errs []error
	for _, f := range fwds {
		if err := f.Stop(s.cfg.ShutdownTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stop stops the forwarders (SIGTERM, then waits), the generator, the
// broker, the mock platform and PostgreSQL, in that order, and reports the
// first error, a forwarder that did not exit cleanly included. The database
// stays in Dir for the next run.
func (s *Stack) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()

	var errs []error
	if err := s.StopForwarders(); err != nil {
		errs = append(errs, err)
	}
	if err := s.StopGenerator(); err != nil {
		errs = append(errs, fmt.Errorf("generator: %w", err))
	}
	if s.Generator != nil {
		s.Generator.Close()
	}
	if s.Kafka != nil {
		s.Kafka.Close()
	}
	if s.Platform != nil {
		if err := s.Platform.Close(); err != nil {
			errs = append(errs, fmt.Errorf("mock platform: %w", err))
		}
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.PG != nil {
		if err := s.PG.Stop("fast"); err != nil {
			errs = append(errs, err)
		}
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
	unlock(s.lock)
	return errors.Join(errs...)
}

// ensureDatabase creates database name on c unless it exists and returns
// its URL.
func ensureDatabase(ctx context.Context, c *pgcluster.Cluster, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("connecting to the dev PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("looking for database %s: %w", name, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", fmt.Errorf("creating database %s: %w", name, err)
		}
	}
	return c.DSN(name), nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating the dev platform password: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
