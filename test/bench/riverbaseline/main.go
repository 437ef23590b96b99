// Command riverbaseline is the bench's third baseline: the forwarder's
// pipeline written with River (github.com/riverqueue/river), the job queue
// a Go developer would pick instead of the forwarder. It consumes the same
// Kafka topics as the forwarder, maps each message with the baselines'
// mapping (test/bench/internal/platformcall), inserts one River job per
// message in a transaction per Kafka poll and commits the offsets once that
// transaction has committed, so that, like the forwarder, it loses nothing
// between Kafka and PostgreSQL; 64 River workers POST the jobs to the
// platform, and River retries a failed POST.
//
// It keeps nothing else: no dedupe of redelivered messages, no lookup
// columns, no attempt log beyond what River keeps in its job row (attempt
// count and errors).
//
// It is a module of its own so that River never becomes a dependency of the
// product. It takes the mapping and the POST from this checkout (go.mod
// replaces the forwarder's module with the repository root) rather than from
// a copy, so that its requests cannot drift from the other baselines'; Go
// prunes the module graph to the packages it imports, so none of the
// product's other dependencies (Benthos) enter its go.sum. The bench builds
// it into its work directory and runs it as a child process like the other
// baselines, with the same environment (docs/configuration.md):
//
//	riverbaseline migrate                    # River's schema, into DATABASE_URL
//	riverbaseline -workers 64 -batch-size 500
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/test/bench/internal/platformcall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel(os.Getenv("LOG_LEVEL"))}))

	var err error
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		err = migrate(ctx, log)
	} else {
		err = run(ctx, log, os.Args[1:])
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "riverbaseline:", err)
		os.Exit(1)
	}
}

// migrate brings DATABASE_URL to River's current schema with River's own
// migrator, as a River user's deployment would.
func migrate(ctx context.Context, log *slog.Logger) error {
	pool, err := outboxdb.Open(ctx, os.Getenv("DATABASE_URL"), outboxdb.PoolConfig{MaxConns: 1, ApplicationName: "bench-river-migrate"})
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: log})
	if err != nil {
		return fmt.Errorf("creating River's migrator: %w", err)
	}
	res, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrating River's schema: %w", err)
	}
	log.Info("River's schema migrated", "versions", len(res.Versions))
	return nil
}

// postArgs is one message's job: what its POST needs.
type postArgs struct {
	Key  string `json:"key"`
	Path string `json:"path"`
	// Body is the mapped request, a JSON object inside the job's args
	// (jsonb keeps its fields, not their order, which the platform does
	// not read); MappingError says why there is none.
	Body         json.RawMessage `json:"body,omitempty"`
	MappingError string          `json:"mapping_error,omitempty"`
}

func (postArgs) Kind() string { return "platform_post" }

// progress is what the run's log reports every 5 s and at the end.
type progress struct {
	inserted, worked atomic.Int64
	// busy counts the workers POSTing now. Averaged over a period in
	// which jobs were waiting, it tells what limited the run: near the
	// worker count, the POSTs; well below, River's fetching.
	busy atomic.Int64
}

// report logs the progress every 5 s until ctx ends, with the mean number
// of busy workers, sampled every 10 ms.
func (p *progress) report(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool) {
	sample := time.NewTicker(10 * time.Millisecond)
	defer sample.Stop()
	every := time.NewTicker(5 * time.Second)
	defer every.Stop()
	var sum, n int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-sample.C:
			sum += p.busy.Load()
			n++
		case <-every.C:
			logProgress(log, "progress", pool, p, "mean_busy_workers", fmt.Sprintf("%.1f", float64(sum)/float64(max(n, 1))))
			sum, n = 0, 0
		}
	}
}

// postWorker sends one job's request.
type postWorker struct {
	river.WorkerDefaults[postArgs]
	http     *http.Client
	baseURL  string
	progress *progress
}

// Work returns an error when the platform did not accept the request, so
// that River retries the job with its backoff; a refusal the platform means
// for good (errcode 998, docs/configuration.md#platform-responses) and a
// message that could not be mapped cancel the job instead.
func (w *postWorker) Work(ctx context.Context, job *river.Job[postArgs]) error {
	if job.Args.MappingError != "" {
		return river.JobCancel(errors.New(job.Args.MappingError))
	}
	w.progress.busy.Add(1)
	defer w.progress.busy.Add(-1)
	defer w.progress.worked.Add(1)
	o := platformcall.Post(ctx, w.http, w.baseURL, job.Args.Path, job.Args.Body)
	switch o.Status {
	case outboxdb.StatusSuccess:
		return nil
	case outboxdb.StatusFailed:
		return river.JobCancel(fmt.Errorf("posting %s: %s", job.Args.Key, *o.Err))
	default:
		return fmt.Errorf("posting %s: %s", job.Args.Key, *o.Err)
	}
}

func run(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("riverbaseline", flag.ContinueOnError)
	workers := fs.Int("workers", 64, "River workers (the default queue's MaxWorkers): concurrent POSTs")
	batch := fs.Int("batch-size", 500, "most Kafka records per poll, inserted in one transaction")
	conns := fs.Int("conns", 8, "PostgreSQL connections of the pool River and the consumer share")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env := platformcall.Env
	topics, mapper, err := platformcall.MapperFromEnv()
	if err != nil {
		return err
	}

	// River's benchmark (cmd/river/riverbench) takes pgxpool's defaults,
	// max(4, cores) connections: 4 here. River's notifier holds one for
	// LISTEN and the consumer's transactions need one beside the fetches
	// and the completer, so this pool gets the 8 the forwarder's shared
	// pool has (docs/configuration.md), lest River wait for connections.
	pool, err := outboxdb.Open(ctx, os.Getenv("DATABASE_URL"), outboxdb.PoolConfig{MaxConns: int32(*conns), ApplicationName: "bench-river"})
	if err != nil {
		return err
	}
	defer pool.Close()
	// The bench's report states the server's durability; this says River's
	// sessions run with it (River sets none of these itself).
	var fsync, fpw, syncCommit string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('full_page_writes'), current_setting('synchronous_commit')`).
		Scan(&fsync, &fpw, &syncCommit); err != nil {
		return fmt.Errorf("reading the durability settings: %w", err)
	}
	log.Info("durability", "fsync", fsync, "full_page_writes", fpw, "synchronous_commit", syncCommit)

	prog := &progress{}
	w := &postWorker{
		progress: prog,
		baseURL:  strings.TrimRight(env("PLATFORM_URL", "http://localhost:8080"), "/"),
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			MaxIdleConns: *workers, MaxIdleConnsPerHost: *workers, IdleConnTimeout: 90 * time.Second,
		}},
	}
	workersReg := river.NewWorkers()
	river.AddWorker(workersReg, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		// From River's own benchmark (cmd/river/riverbench, "when
		// benchmarking to maximize job throughput these numbers have an
		// outsized effect on results"): fetch at most every 2 ms instead
		// of 100 ms, and poll every 20 ms instead of every second should a
		// LISTEN/NOTIFY wake-up be missed. It leaves everything else at
		// River's defaults, and so does this: the batch completer
		// (completions written in batches every 50 ms, or 250 ms when
		// fewer than 100 are waiting), completed jobs kept 24 h by the job
		// cleaner (far longer than a run, so the bench can count them), 25
		// attempts with River's backoff, a 1-minute job timeout.
		//
		// The benchmark runs 2 000 workers; this pipeline runs 64, the
		// concurrent POSTs the forwarder and the hand-batched loop make.
		// River locks at most MaxWorkers minus the running jobs per fetch,
		// one fetch at a time, so 64 also caps its fetches: on the loaded
		// 2-core bench machine it fetched 26 jobs a query and kept 4-10 of
		// its 64 workers busy on average, bound by fetching and not by the
		// poll interval (5 ms made as many fetches as 20 ms); 256 workers
		// fetched 65 a query. -workers changes it.
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
		Workers:           workersReg,
		Logger:            log,
	})
	if err != nil {
		return fmt.Errorf("creating the River client: %w", err)
	}
	// Cancelling Start's context is River's abrupt shutdown, which cancels
	// the jobs being worked; the signal stops River gracefully with Stop,
	// which lets them finish and their completions be written.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("starting the River client: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := client.Stop(stopCtx); err != nil {
			log.Error("stopping the River client", "err", err)
		}
		logProgress(log, "stopped", pool, prog)
	}()

	kafka, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(env("KAFKA_BROKERS", "localhost:9092"), ",")...),
		kgo.ConsumerGroup(env("KAFKA_GROUP", "forwarder")),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(6*time.Second),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		return err
	}
	defer kafka.Close()

	if log.Enabled(ctx, slog.LevelInfo) {
		go prog.report(ctx, log, pool)
	}
	c := &consumer{pool: pool, river: client, kafka: kafka, mapper: mapper, batch: *batch, progress: prog}
	err = c.run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// consumer moves Kafka records into River jobs.
type consumer struct {
	pool     *pgxpool.Pool
	river    *river.Client[pgx.Tx]
	kafka    *kgo.Client
	mapper   *platformcall.Mapper
	batch    int
	progress *progress
}

// run polls Kafka and, per poll, inserts one job per record in one
// transaction, then commits the records' offsets: a crash between the two
// redelivers the records (duplicate jobs, which River does not dedupe),
// never loses one.
func (c *consumer) run(ctx context.Context) error {
	for {
		fetches := c.kafka.PollRecords(ctx, c.batch)
		if ctx.Err() != nil {
			return nil
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("polling Kafka: %w", errs[0].Err)
		}
		recs := fetches.Records()
		if len(recs) == 0 {
			continue
		}
		params := make([]river.InsertManyParams, len(recs))
		for i, r := range recs {
			m := c.mapper.Map(r.Topic, r.Partition, r.Offset, r.Key, r.Value)
			a := postArgs{Key: m.Key, Path: m.Path, Body: m.Body}
			if m.Err != nil {
				a.Body, a.MappingError = nil, m.Err.Error()
			}
			params[i].Args = a
		}
		if err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			_, err := c.river.InsertManyTx(ctx, tx, params)
			return err
		}); err != nil {
			return fmt.Errorf("inserting %d jobs: %w", len(params), err)
		}
		c.progress.inserted.Add(int64(len(params)))
		if err := c.kafka.CommitRecords(ctx, recs...); err != nil {
			return fmt.Errorf("committing offsets: %w", err)
		}
	}
}

// logProgress says how far the run is and whether anything waited for a
// database connection (the pool's empty acquires), which would make the
// pool, not River or the platform, the bottleneck.
func logProgress(log *slog.Logger, msg string, pool *pgxpool.Pool, p *progress, attrs ...any) {
	st := pool.Stat()
	log.Info(msg, append([]any{"inserted", p.inserted.Load(), "worked", p.worked.Load(),
		"pool_acquires", st.AcquireCount(), "pool_empty_acquires", st.EmptyAcquireCount(),
		"pool_acquire_wait", st.AcquireDuration().Round(time.Millisecond), "pool_conns", st.TotalConns()}, attrs...)...)
}

func logLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return slog.LevelWarn
	}
	return l
}
