package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Scenario names.
const (
	scenarioForwarder = "forwarder"
	scenarioNaive     = "naive"
	scenarioBatched   = "batched"
)

// accessName is the platform user every consumer sends.
const accessName = "bench"

// benchEnv is what the scenarios share: PostgreSQL, the broker and the
// prefilled backlog.
type benchEnv struct {
	cfg       benchConfig
	dir       string
	ownDir    bool
	pg        *pgcluster.Cluster
	pgPID     int
	kafka     *kfake.Cluster
	admin     *kadm.Client
	brokers   string
	accessPwd string
	// riverBin is the River baseline, built when a run needs it.
	riverBin string

	// backlog topics, filled once by prefill and read by every scenario
	// with its own consumer group.
	vehicleTopic, heartbeatTopic string
	prefilled                    int
}

// startEnv starts the run's PostgreSQL and Kafka broker; kafkaOpts are
// added to the broker's defaults.
func startEnv(ctx context.Context, cfg benchConfig, kafkaOpts ...kfake.Opt) (env *benchEnv, err error) {
	e := &benchEnv{cfg: cfg, dir: cfg.Dir}
	defer func() {
		if err != nil { // env is nil then
			e.close()
		}
	}()
	env = e
	if env.dir == "" {
		if env.dir, err = os.MkdirTemp("", "forwarder-bench-"); err != nil {
			return nil, err
		}
		env.ownDir = true
	}
	if env.accessPwd, err = randomHex(12); err != nil {
		return nil, err
	}
	settings := map[string]string{}
	if cfg.PGStatements {
		settings["shared_preload_libraries"] = "pg_stat_statements"
		settings["pg_stat_statements.track"] = "all"
		// Planning time too: a statement planned at each call (a custom
		// plan, or no prepared statement behind a pooler) shows it.
		settings["pg_stat_statements.track_planning"] = "on"
	}
	for _, kv := range cfg.PGSets {
		name, value, _ := strings.Cut(kv, "=")
		settings[strings.TrimSpace(name)] = value
	}
	logf("starting PostgreSQL in %s", filepath.Join(env.dir, "pg"))
	if env.pg, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(env.dir, "pg"), Durable: cfg.Durable, Settings: settings}); err != nil {
		return nil, err
	}
	if env.pgPID, err = postmasterPID(env.pg.Dir()); err != nil {
		return nil, err
	}
	if env.kafka, err = kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second)}, kafkaOpts...)...); err != nil {
		return nil, fmt.Errorf("starting the Kafka broker: %w", err)
	}
	env.brokers = strings.Join(env.kafka.ListenAddrs(), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.kafka.ListenAddrs()...))
	if err != nil {
		return nil, fmt.Errorf("creating the Kafka admin client: %w", err)
	}
	env.admin = kadm.NewClient(cl)
	return env, nil
}

func (env *benchEnv) close() {
	if env.admin != nil {
		env.admin.Close()
	}
	if env.kafka != nil {
		env.kafka.Close()
	}
	if env.pg != nil {
		if env.cfg.Keep {
			_ = env.pg.Stop("fast")
		} else {
			_ = env.pg.Remove()
		}
	}
	if env.ownDir {
		if env.cfg.Keep {
			logf("work directory kept: %s", env.dir)
		} else {
			_ = os.RemoveAll(env.dir)
		}
	}
}

func (env *benchEnv) serverVersion(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, env.pg.DSN("postgres"))
	if err != nil {
		return "?"
	}
	defer conn.Close(ctx)
	return serverVersion(ctx, conn)
}

func serverVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	var v string
	if err := q.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// createTopics creates the two topics of one run.
func (env *benchEnv) createTopics(ctx context.Context, prefix string) (vehicle, heartbeat string, err error) {
	vehicle, heartbeat = prefix+"-vehicle-event", prefix+"-heartbeat"
	resp, err := env.admin.CreateTopics(ctx, int32(env.cfg.Partitions), 1, nil, vehicle, heartbeat)
	if err != nil {
		return "", "", fmt.Errorf("creating topics %s and %s: %w", vehicle, heartbeat, err)
	}
	if err := resp.Error(); err != nil {
		return "", "", fmt.Errorf("creating topics %s and %s: %w", vehicle, heartbeat, err)
	}
	return vehicle, heartbeat, nil
}

// deleteTopics deletes topics from the in-process broker, which keeps every
// record in this process's heap: a topic a phase no longer reads would
// otherwise make every later garbage collection of this process longer.
func (env *benchEnv) deleteTopics(ctx context.Context, topics ...string) error {
	resp, err := env.admin.DeleteTopics(ctx, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("deleting topics %s: %w", strings.Join(topics, ", "), err)
	}
	return nil
}

// newSource makes realistic camera traffic: vehicle events and heartbeats
// 4:1, every message good and unique, so every row must end SUCCESS.
func (env *benchEnv) newSource(vehicle, heartbeat string, seed uint64) (*eventgen.Source, error) {
	return eventgen.NewSource(eventgen.SourceConfig{
		VehicleTopic: vehicle, HeartbeatTopic: heartbeat, Seed: seed, Devices: sourceDevices(env.cfg.Berths),
	})
}

// prefill writes the throughput backlog: cfg.N messages.
func (env *benchEnv) prefill(ctx context.Context) error {
	var err error
	if env.vehicleTopic, env.heartbeatTopic, err = env.createTopics(ctx, "backlog"); err != nil {
		return err
	}
	src, err := env.newSource(env.vehicleTopic, env.heartbeatTopic, env.cfg.Seed)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.kafka.ListenAddrs()...), kgo.ProducerLinger(10*time.Millisecond),
		kgo.MaxBufferedRecords(50_000))
	if err != nil {
		return err
	}
	defer cl.Close()
	start := time.Now()
	var vehicles int
	errc := make(chan error, 1)
	for i := 0; i < env.cfg.N; i++ {
		m := src.Next()
		if m.Kind == eventgen.Vehicle {
			vehicles++
		}
		cl.Produce(ctx, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("prefilling Kafka: %w", err)
	}
	select {
	case err := <-errc:
		return fmt.Errorf("prefilling Kafka: %w", err)
	default:
	}
	env.prefilled = env.cfg.N
	logf("Kafka prefilled with %d messages (%d vehicle events, %d heartbeats) in %.1fs",
		env.cfg.N, vehicles, env.cfg.N-vehicles, time.Since(start).Seconds())
	return nil
}

// createDB makes a fresh, migrated database for one run.
func (env *benchEnv) createDB(ctx context.Context, name string) (dsn string, pool *pgxpool.Pool, err error) {
	conn, err := pgx.Connect(ctx, env.pg.DSN("postgres"))
	if err != nil {
		return "", nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", nil, fmt.Errorf("dropping database %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	dsn = env.pg.DSN(name)
	if pool, err = outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 2, ApplicationName: "forwarder-bench"}); err != nil {
		return "", nil, err
	}
	if err := env.migrate(ctx, name, pool, dsn); err != nil {
		pool.Close()
		return "", nil, err
	}
	if env.cfg.PGStatements {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			pool.Close()
			return "", nil, fmt.Errorf("creating pg_stat_statements: %w", err)
		}
		if _, err := pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			pool.Close()
			return "", nil, err
		}
	}
	return dsn, pool, nil
}

// dropDB removes a run's database, so that its autovacuum does not run
// during the next one.
func (env *benchEnv) dropDB(ctx context.Context, name string) {
	if env.cfg.Keep {
		return
	}
	conn, err := pgx.Connect(ctx, env.pg.DSN("postgres"))
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// consumerEnv is the documented environment (docs/configuration.md) of one run, given to the
// forwarder and to the baselines alike.
func (env *benchEnv) consumerEnv(dsn, platformURL, group, vehicle, heartbeat string) map[string]string {
	vars := map[string]string{
		"KAFKA_BROKERS":         env.brokers,
		"KAFKA_GROUP":           group,
		"KAFKA_TOPIC_VEHICLE":   vehicle,
		"KAFKA_TOPIC_HEARTBEAT": heartbeat,
		"DATABASE_URL":          dsn,
		"PLATFORM_URL":          platformURL,
		"PLATFORM_ACCESS_NAME":  accessName,
		"PLATFORM_ACCESS_PWD":   env.accessPwd,
		"LOG_LEVEL":             env.cfg.LogLevel,
	}
	if env.cfg.Pooled {
		// The baselines ignore it.
		vars["DATABASE_DIRECT_URL"] = dsn
	}
	return vars
}

// isForwarder says whether scenario runs a build of the forwarder (not a
// baseline).
func isForwarder(scenario string) bool {
	switch scenario {
	case scenarioForwarder, scenarioUnordered, scenarioPrevious:
		return true
	}
	return false
}

// child is a consumer process: bin/forwarder or a baseline.
type child struct {
	*childproc.Process
	name     string
	httpAddr string // the forwarder's HTTP server
	logPath  string
}

// startConsumer starts the consumer of scenario in its own process.
func (env *benchEnv) startConsumer(ctx context.Context, scenario, run string, vars map[string]string, pprof bool) (*child, error) {
	logPath := filepath.Join(env.dir, run+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	c := &child{name: scenario, logPath: logPath}
	all := maps.Clone(vars)
	if all == nil {
		all = map[string]string{}
	}
	var path string
	var args []string
	dir := env.cfg.Root
	switch {
	case isForwarder(scenario):
		if c.httpAddr, err = childproc.FreeAddr(); err != nil {
			return nil, err
		}
		all["HTTP_ADDR"] = c.httpAddr
		maps.Copy(all, orderingEnv(scenario))
		for _, kv := range env.cfg.Env {
			k, v, _ := strings.Cut(kv, "=")
			all[k] = v
		}
		args = []string{"-c", env.cfg.Pipeline}
		sets := append([]string(nil), env.cfg.Sets...)
		if pprof {
			sets = append(sets, "http.debug_endpoints=true")
		}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		path = resolve(env.cfg.Root, env.cfg.Forwarder)
		if scenario == scenarioPrevious {
			// Its own pipeline and mappings: an earlier binary may not
			// know today's fields.
			dir = env.cfg.Previous
			path = filepath.Join(dir, "bin", "forwarder")
			args[1] = "pipelines/forwarder.yaml"
		}
	case scenario == scenarioRiver:
		path = env.riverBin
		args = []string{"-workers", fmt.Sprint(env.cfg.RiverWorkers), "-batch-size", fmt.Sprint(env.cfg.BatchSize)}
	default:
		if path, err = os.Executable(); err != nil {
			return nil, err
		}
		args = []string{"baseline", "-mode", scenario,
			"-workers", fmt.Sprint(env.cfg.NaiveWorkers),
			"-batch-size", fmt.Sprint(env.cfg.BatchSize),
			"-posts", fmt.Sprint(env.cfg.BatchPosts)}
	}
	// Should the bench die, its consumer dies with it.
	c.Process, err = childproc.Start(childproc.Spec{
		Path: path, Args: args, Dir: dir,
		Environ: os.Environ(), Env: all, Output: logFile, ParentDeath: syscall.SIGKILL,
	})
	if err != nil {
		return nil, err
	}
	if c.httpAddr != "" {
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := c.WaitPing(pctx, c.httpAddr); err != nil {
			c.Kill()
			return nil, fmt.Errorf("the forwarder %w\n%s", err, childproc.TailFile(logPath, 3000))
		}
	}
	return c, nil
}

// exited returns an error when the process has ended.
func (c *child) exited() error {
	if !c.Exited() {
		return nil
	}
	return fmt.Errorf("%s exited early: %v\n%s", c.name, c.Err(), childproc.TailFile(c.logPath, 3000))
}

// stop sends SIGTERM and waits, then kills.
func (c *child) stop(timeout time.Duration) error {
	if err := c.Stop(timeout); err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	return nil
}

func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// privateCluster starts a PostgreSQL cluster of cfg (its Dir is set here)
// in dir/pg, dir being a new temporary directory named after prefix when
// dir is "". stop stops it and removes the directory it made; with keep, or
// in a directory given, it only stops it and says where it is.
func privateCluster(ctx context.Context, dir, prefix string, keep bool, cfg pgcluster.Config) (pg *pgcluster.Cluster, stop func(), err error) {
	own := dir == ""
	if own {
		if dir, err = os.MkdirTemp("", prefix); err != nil {
			return nil, nil, err
		}
	}
	cfg.Dir = filepath.Join(dir, "pg")
	if pg, err = pgcluster.Start(ctx, cfg); err != nil {
		return nil, nil, err
	}
	return pg, func() {
		if keep || !own {
			_ = pg.Stop("fast")
			logf("cluster kept in %s", dir)
			return
		}
		_ = pg.Remove()
		_ = os.RemoveAll(dir)
	}, nil
}
