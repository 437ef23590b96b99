package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/test/bench/internal/platformcall"
)

// The two baselines the forwarder is compared with. Both read the same
// environment as the forwarder (docs/configuration.md), write the same tables and send
// the same requests; each runs in its own process (`bench baseline -mode
// naive|batched`), started by the bench and stopped with SIGTERM.

//go:embed sql/*.sql
var sqlFS embed.FS

func mustSQL(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name)
	if err != nil {
		panic(fmt.Sprintf("bench: embedded query %s: %v", name, err))
	}
	return string(b)
}

var (
	naiveInsertSQL   = mustSQL("naive_insert.sql")
	naiveResultSQL   = mustSQL("naive_result.sql")
	naiveLogSQL      = mustSQL("naive_log.sql")
	batchedInsertSQL = mustSQL("batched_insert.sql")
	batchedResultSQL = mustSQL("batched_result.sql")
	batchedRetrySQL  = mustSQL("batched_retry.sql")
)

// retryDelay is when a baseline retries a failed POST. The benchmark's
// mock platform injects no faults, but a POST can still time out on a
// loaded machine: the hand-batched loop once waited forever for two such
// rows, which nothing sent again.
const retryDelay = 5 * time.Second

type baseline struct {
	mode                  string
	workers, batch, posts int
	brokers, group        string
	topics                []string
	dsn, url              string
	mapper                *platformcall.Mapper
	pool                  *pgxpool.Pool
	kafka                 *kgo.Client
	http                  *http.Client
}

func runBaseline(ctx context.Context, args []string) error {
	b := &baseline{}
	fs := flag.NewFlagSet("baseline", flag.ContinueOnError)
	fs.StringVar(&b.mode, "mode", scenarioNaive, "naive or batched")
	fs.IntVar(&b.workers, "workers", 32, "naive: concurrent workers")
	fs.IntVar(&b.batch, "batch-size", 500, "batched: messages per batch")
	fs.IntVar(&b.posts, "posts", 64, "batched: concurrent POSTs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	env := platformcall.Env
	b.brokers, b.group = env("KAFKA_BROKERS", "localhost:9092"), env("KAFKA_GROUP", "forwarder")
	b.dsn, b.url = env("DATABASE_URL", ""), strings.TrimRight(env("PLATFORM_URL", "http://localhost:8080"), "/")
	var err error
	if b.topics, b.mapper, err = platformcall.MapperFromEnv(); err != nil {
		return err
	}

	conns := 4
	httpConns := b.posts
	if b.mode == scenarioNaive {
		conns, httpConns = b.workers, b.workers
	}
	if b.pool, err = outboxdb.Open(ctx, b.dsn, outboxdb.PoolConfig{MaxConns: int32(conns), ApplicationName: "bench-" + b.mode}); err != nil {
		return err
	}
	defer b.pool.Close()
	b.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: httpConns, MaxIdleConnsPerHost: httpConns, IdleConnTimeout: 90 * time.Second,
	}}

	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(b.brokers, ",")...),
		kgo.ConsumerGroup(b.group),
		kgo.ConsumeTopics(b.topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(6 * time.Second),
	}
	switch b.mode {
	case scenarioNaive:
		// Offsets are marked as messages finish, in order per partition.
		opts = append(opts, kgo.AutoCommitMarks(), kgo.AutoCommitInterval(time.Second))
	case scenarioBatched:
		opts = append(opts, kgo.DisableAutoCommit())
	default:
		return fmt.Errorf("-mode %q: want naive or batched", b.mode)
	}
	if b.kafka, err = kgo.NewClient(opts...); err != nil {
		return err
	}
	defer b.kafka.Close()

	if b.mode == scenarioNaive {
		err = b.runNaive(ctx)
	} else {
		err = b.runBatched(ctx)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// rowStatus is the status a message's row is stored with: FAILED, never
// sent, when it could not be mapped.
func rowStatus(m *platformcall.Mapped) (outboxdb.Status, string) {
	if m.Err != nil {
		return outboxdb.StatusFailed, m.Err.Error()
	}
	return outboxdb.StatusPending, ""
}

// runNaive is the textbook outbox forwarder: a poller hands messages to
// workers; each worker persists its message in a transaction, POSTs it and
// writes the result and the attempt log in a second transaction. Offsets are
// committed once the insert of every message up to them has committed.
func (b *baseline) runNaive(ctx context.Context) error {
	work := make(chan *kgo.Record, 4*b.workers)
	tr := newOffsetTracker()
	var wg sync.WaitGroup
	errc := make(chan error, b.workers)
	for range b.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				if err := b.naiveOne(ctx, r, tr); err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
			}
		}()
	}
	defer func() { close(work); wg.Wait() }()
	for {
		fetches := b.kafka.PollRecords(ctx, 1000)
		if ctx.Err() != nil {
			return nil
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("polling Kafka: %w", errs[0].Err)
		}
		for _, r := range fetches.Records() {
			tr.add(r)
			select {
			case work <- r:
			case err := <-errc:
				return err
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func (b *baseline) naiveOne(ctx context.Context, r *kgo.Record, tr *offsetTracker) error {
	m := b.mapper.Map(r.Topic, r.Partition, r.Offset, r.Key, r.Value)
	status, lastErr := rowStatus(&m)
	var id int64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, naiveInsertSQL, m.Key, m.APIType, m.Topic, m.Partition, m.Offset,
			m.KafkaKey, m.Payload, string(status), lastErr, m.Plate, m.Park, m.Berth, m.Device).Scan(&id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil // already stored: a redelivery
		id = 0
	}
	if err != nil {
		return fmt.Errorf("inserting %s: %w", m.Key, err)
	}
	if eo, ok := tr.finish(r); ok {
		b.kafka.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{r.Topic: {r.Partition: eo}})
	}
	if id == 0 || status != outboxdb.StatusPending {
		return nil
	}
	o := platformcall.Post(ctx, b.http, b.url, m.Path, m.Body)
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var (
			attempt int32
			next    *time.Time
		)
		if err := tx.QueryRow(ctx, naiveResultSQL, id, string(o.Status), retryDelay.Milliseconds(), o.HTTPStatus, o.Err).
			Scan(&attempt, &next); err != nil {
			return fmt.Errorf("recording %s: %w", m.Key, err)
		}
		_, err := tx.Exec(ctx, naiveLogSQL, id, attempt, string(o.Status), o.HTTPStatus, o.Errcode, o.Err, o.DurationMs, next)
		return err
	})
}

// offsetTracker finds, per partition, the highest offset below which every
// dispatched message is done, so that workers finishing out of order never
// commit past a message still in flight.
type offsetTracker struct {
	mu    sync.Mutex
	parts map[string]map[int32]*partTrack
}

type partTrack struct {
	queue []int64
	done  map[int64]bool
}

func newOffsetTracker() *offsetTracker {
	return &offsetTracker{parts: map[string]map[int32]*partTrack{}}
}

func (t *offsetTracker) part(topic string, p int32) *partTrack {
	ps := t.parts[topic]
	if ps == nil {
		ps = map[int32]*partTrack{}
		t.parts[topic] = ps
	}
	pt := ps[p]
	if pt == nil {
		pt = &partTrack{done: map[int64]bool{}}
		ps[p] = pt
	}
	return pt
}

func (t *offsetTracker) add(r *kgo.Record) {
	t.mu.Lock()
	pt := t.part(r.Topic, r.Partition)
	pt.queue = append(pt.queue, r.Offset)
	t.mu.Unlock()
}

func (t *offsetTracker) finish(r *kgo.Record) (kgo.EpochOffset, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pt := t.part(r.Topic, r.Partition)
	pt.done[r.Offset] = true
	last := int64(-1)
	for len(pt.queue) > 0 && pt.done[pt.queue[0]] {
		last = pt.queue[0]
		delete(pt.done, last)
		pt.queue = pt.queue[1:]
	}
	if last < 0 {
		return kgo.EpochOffset{}, false
	}
	return kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: last + 1}, true
}

// runBatched is the hand-batched forwarder: per batch of up to b.batch
// messages, one unnest insert, a synchronous offset commit, b.posts
// concurrent POSTs and one statement for all the results and logs.
//
// Between polls, every retryDelay, it sends again the rows whose POST
// failed (batched_retry.sql), as any loop that must not lose a message has to.
func (b *baseline) runBatched(ctx context.Context) error {
	swept := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, retryDelay)
		fetches := b.kafka.PollRecords(pctx, b.batch)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		for _, e := range fetches.Errors() {
			if !errors.Is(e.Err, context.DeadlineExceeded) {
				return fmt.Errorf("polling Kafka: %w", e.Err)
			}
		}
		if recs := fetches.Records(); len(recs) > 0 {
			if err := b.batchOnce(ctx, recs); err != nil {
				return err
			}
		}
		if time.Since(swept) >= retryDelay {
			swept = time.Now()
			if err := b.retryDue(ctx); err != nil {
				return err
			}
		}
	}
}

// retryDue sends again, and records, up to a batch of the rows whose POST
// failed and whose retry time has come.
func (b *baseline) retryDue(ctx context.Context) error {
	rows, err := b.pool.Query(ctx, batchedRetrySQL, b.batch)
	if err != nil {
		return fmt.Errorf("reading rows to retry: %w", err)
	}
	var jobs []postJob
	for rows.Next() {
		var (
			id, offset   int64
			topic        string
			part         int32
			key, payload []byte
		)
		if err := rows.Scan(&id, &topic, &part, &offset, &key, &payload); err != nil {
			rows.Close()
			return err
		}
		m := b.mapper.Map(topic, part, offset, key, payload)
		jobs = append(jobs, postJob{id, &m})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading rows to retry: %w", err)
	}
	return b.postAndRecord(ctx, jobs)
}

// postJob is one stored row to POST.
type postJob struct {
	id int64
	m  *platformcall.Mapped
}

func (b *baseline) batchOnce(ctx context.Context, recs []*kgo.Record) error {
	ms := make([]platformcall.Mapped, 0, len(recs))
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		m := b.mapper.Map(r.Topic, r.Partition, r.Offset, r.Key, r.Value)
		if !seen[m.Key] {
			seen[m.Key] = true
			ms = append(ms, m)
		}
	}
	n := len(ms)
	var (
		keys, apiTypes, topics, statuses, lastErrs = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		plates, parks, berths, devices             = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		parts                                      = make([]int32, n)
		offsets                                    = make([]int64, n)
		kafkaKeys, payloads                        = make([][]byte, n), make([][]byte, n)
	)
	for i := range ms {
		m := &ms[i]
		st, le := rowStatus(m)
		keys[i], apiTypes[i], topics[i], statuses[i], lastErrs[i] = m.Key, m.APIType, m.Topic, string(st), le
		parts[i], offsets[i], kafkaKeys[i], payloads[i] = m.Partition, m.Offset, m.KafkaKey, m.Payload
		plates[i], parks[i], berths[i], devices[i] = m.Plate, m.Park, m.Berth, m.Device
	}
	rows, err := b.pool.Query(ctx, batchedInsertSQL, keys, apiTypes, topics, parts, offsets, kafkaKeys, payloads, statuses, lastErrs,
		plates, parks, berths, devices)
	if err != nil {
		return fmt.Errorf("inserting a batch: %w", err)
	}
	ids := make(map[string]int64, n)
	for rows.Next() {
		var (
			id  int64
			key string
		)
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return err
		}
		ids[key] = id
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inserting a batch: %w", err)
	}
	if err := b.kafka.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("committing offsets: %w", err)
	}

	var jobs []postJob
	for i := range ms {
		if id, ok := ids[ms[i].Key]; ok && ms[i].Err == nil {
			jobs = append(jobs, postJob{id, &ms[i]})
		}
	}
	return b.postAndRecord(ctx, jobs)
}

// postAndRecord POSTs the jobs, b.posts at a time, and records every
// outcome and attempt log in one statement.
func (b *baseline) postAndRecord(ctx context.Context, jobs []postJob) error {
	outs := make([]platformcall.Outcome, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(b.posts, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				outs[i] = platformcall.Post(ctx, b.http, b.url, jobs[i].m.Path, jobs[i].m.Body)
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(jobs) == 0 {
		return nil
	}

	k := len(jobs)
	var (
		rIDs      = make([]int64, k)
		rStatuses = make([]string, k)
		rRetry    = make([]int64, k)
		rHTTP     = make([]*int32, k)
		rErrs     = make([]*string, k)
		rCodes    = make([]*string, k)
		rDur      = make([]int32, k)
	)
	for i, j := range jobs {
		o := outs[i]
		rIDs[i], rStatuses[i], rRetry[i] = j.id, string(o.Status), retryDelay.Milliseconds()
		rHTTP[i], rErrs[i], rCodes[i], rDur[i] = o.HTTPStatus, o.Err, o.Errcode, o.DurationMs
	}
	if _, err := b.pool.Exec(ctx, batchedResultSQL, rIDs, rStatuses, rRetry, rHTTP, rErrs, rCodes, rDur); err != nil {
		return fmt.Errorf("recording a batch: %w", err)
	}
	return nil
}
