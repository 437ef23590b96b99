package main

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/internal/testsupport/otlpreceiver"
)

// throughputResult is one scenario's run on the Kafka backlog.
type throughputResult struct {
	Scenario string
	// Round is the round of -rounds the phase ran in, from 1.
	Round    int
	Messages int
	// Window runs from the first row's created_at to the last row's
	// succeeded_at, on the database clock: start-up and the detection of
	// the end are left out, the same way for every scenario.
	Window     time.Duration
	MsgsPerSec float64
	// Wall runs from starting the consumer to seeing every row SUCCESS.
	Wall time.Duration
	// Consumer is the consumer process (its CPU since it started), PG the
	// PostgreSQL server and its backends (peak PSS), Self this process
	// (broker and mock platform), all over Wall.
	Consumer, PG usage
	Self         float64
	// Others is the CPU used by the rest of the machine meanwhile: the
	// other work that disturbed the measurement.
	Others     float64
	Statements []stmtStat
	// PGWork is what PostgreSQL did for the run: commits of the scenario's
	// database, WAL written and WAL flushes of the whole server.
	PGWork   pgCounters
	Requests int64 // platform requests (more than Messages if any were retried)
	StopErr  string
	// LoadStart and LoadEnd are the 1-minute load averages around the run.
	LoadStart, LoadEnd float64
}

// latencyResult is one scenario at a steady rate.
type latencyResult struct {
	Scenario           string
	Round              int
	Rate               float64
	Measured           int
	P50, P90, P99, Max time.Duration
	// Behind is the share of measured messages produced while the message
	// before them of the same berth had not reached the platform yet: with
	// ordering they must wait for it. P99Behind and P99Free are the p99 of
	// those and of the rest.
	Behind             float64
	P99Behind, P99Free time.Duration
	// Cores is the consumer's CPU over the measured part divided by its
	// length; PGCores the same for PostgreSQL.
	Cores, PGCores float64
	// SelfCores is this process (broker, mock platform, producer);
	// OtherCores what the rest of the machine used meanwhile.
	SelfCores, OtherCores float64
	PeakRSS               int64
	// Messages is every message of the phase, warm-up included (the
	// denominator of the statement counts).
	Messages   int
	Statements []stmtStat
	PGWork     pgCounters
	// LoadStart and LoadEnd are the 1-minute load averages around the run.
	LoadStart, LoadEnd float64
}

// pgCounters are PostgreSQL's cumulative work counters: commits of one
// database (pg_stat_database) and the WAL of the server (pg_stat_wal). The
// scenarios run one at a time, so the server's WAL between two readings is
// the scenario's.
type pgCounters struct {
	Commits  int64
	WALBytes int64
	// WALSyncs counts the WAL flushes to disk (fsync): what a synchronous
	// commit waits for.
	WALSyncs int64
}

func (a pgCounters) sub(b pgCounters) pgCounters {
	return pgCounters{Commits: a.Commits - b.Commits, WALBytes: a.WALBytes - b.WALBytes, WALSyncs: a.WALSyncs - b.WALSyncs}
}

// readPGCounters reads the counters of pool's database, after asking this
// backend to publish its own statistics.
func readPGCounters(ctx context.Context, pool *pgxpool.Pool) (pgCounters, error) {
	var c pgCounters
	err := pool.QueryRow(ctx, `SELECT d.xact_commit, w.wal_bytes::bigint, w.wal_sync
		FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()`).Scan(&c.Commits, &c.WALBytes, &c.WALSyncs)
	return c, err
}

// stmtStat is one line of pg_stat_statements.
type stmtStat struct {
	Calls   int64
	TotalMs float64
	// MaxMs is the longest call.
	MaxMs float64
	Rows  int64
	// Plans and PlanMs are the statement's plannings and their time: as
	// many plans as calls means a custom plan made at every call.
	Plans  int64
	PlanMs float64
	Query  string
}

// prepareRun gives one phase of a scenario a fresh database (and a pool on
// it), a fresh mock platform and runCtx, which ends at the phase's timeout;
// done ends runCtx and removes the rest.
func (env *benchEnv) prepareRun(ctx context.Context, run string) (runCtx context.Context, dsn string, pool *pgxpool.Pool, mp *mockplatform.Server, done func(), err error) {
	dsn, pool, err = env.createDB(ctx, run)
	if err != nil {
		return nil, "", nil, nil, nil, err
	}
	mp, err = mockplatform.Start(mockplatform.Config{AccessName: accessName, AccessPwd: env.accessPwd})
	if err != nil {
		pool.Close()
		env.dropDB(context.WithoutCancel(ctx), run)
		return nil, "", nil, nil, nil, err
	}
	runCtx, cancel := context.WithTimeout(ctx, env.cfg.Timeout)
	return runCtx, dsn, pool, mp, func() {
		cancel()
		mp.Close()
		pool.Close()
		env.dropDB(context.WithoutCancel(ctx), run)
	}, nil
}

func (env *benchEnv) throughput(ctx context.Context, scenario string, round int) (res throughputResult, err error) {
	res.Scenario, res.Round, res.LoadStart = scenario, round, loadAvg()
	defer func() { res.LoadEnd = loadAvg() }()
	run, group := throughputRun(scenario, round)
	runCtx, dsn, pool, mp, done, err := env.prepareRun(ctx, run)
	if err != nil {
		return res, err
	}
	defer done()
	n := env.prefilled
	vars := env.consumerEnv(dsn, mp.URL, group, env.vehicleTopic, env.heartbeatTopic)
	logf("%s: consuming the backlog of %d messages", scenario, n)

	if err := settle(runCtx, pool); err != nil {
		return res, fmt.Errorf("before the throughput phase: %w", err)
	}
	before, err := readPGCounters(ctx, pool)
	if err != nil {
		return res, fmt.Errorf("reading PostgreSQL's counters: %w", err)
	}
	m, err := startMeter(env.pgPID)
	if err != nil {
		return res, err
	}
	start := time.Now()
	// Both forwarder scenarios are profiled, each under its own file names,
	// so that ordering on and off can be set side by side.
	profile := env.cfg.PprofDir != "" && (scenario == scenarioForwarder || scenario == scenarioUnordered) && round == 1
	c, err := env.startConsumer(runCtx, scenario, run, vars, profile)
	if err != nil {
		return res, err
	}
	defer c.Kill()
	m.attach(c.Pid(), true)

	var profDone chan error
	if profile {
		profDone = make(chan error, 1)
		go func() { profDone <- c.cpuProfile(runCtx, env.cfg.PprofDir, scenario, env.cfg.PprofSeconds) }()
	}

	if err := waitAllSuccess(runCtx, c, mp, pool, progressOf(scenario), n, scenario); err != nil {
		m.stop()
		return res, err
	}
	res.Consumer, res.PG, res.Self, res.Others = m.stop()
	res.Wall = time.Since(start)
	res.Requests = mp.Stats().Requests
	if profile {
		if err := <-profDone; err != nil {
			logf("forwarder CPU profile: %v", err)
		}
		for _, p := range []string{"heap", "allocs"} {
			if err := c.fetchProfile(runCtx, env.cfg.PprofDir, scenario, p, ""); err != nil {
				logf("forwarder %s profile: %v", p, err)
			}
		}
		// The Go runtime's own figures (heap, GC) and the forwarder's metrics.
		if err := c.fetch(runCtx, "/metrics", filepath.Join(env.cfg.PprofDir, scenario+".metrics.txt")); err != nil {
			logf("forwarder metrics: %v", err)
		}
	}
	if err := c.stop(45 * time.Second); err != nil {
		res.StopErr = err.Error()
		logf("%s: stopping: %v", scenario, err)
	}
	// The consumer's backends published their statistics as they exited.
	if after, err := readPGCounters(ctx, pool); err == nil {
		res.PGWork = after.sub(before)
	}

	var first, last time.Time
	if err := pool.QueryRow(ctx, progressOf(scenario).Window).Scan(&res.Messages, &first, &last); err != nil {
		return res, fmt.Errorf("reading the run's time window: %w", err)
	}
	res.Window = last.Sub(first)
	res.MsgsPerSec = float64(res.Messages) / res.Window.Seconds()
	if env.cfg.PGStatements {
		res.Statements = topStatements(ctx, pool)
	}
	return res, nil
}

// throughputRun names the database (run) and the consumer group of a
// throughput phase. Each round reads the backlog from the start, in a
// group and a database of its own; the database's name ends with the
// scenario, as migrate expects.
// latencyRun names a latency phase's database and consumer group, as
// throughputRun does, and its topics' and sample files' part: the
// scenario, with the round from the second on.
func latencyRun(scenario string, round int) (run, group, name string) {
	if round > 1 {
		return fmt.Sprintf("lat_r%d_%s", round, scenario), fmt.Sprintf("bench-lat-%s-r%d", scenario, round), fmt.Sprintf("%s.r%d", scenario, round)
	}
	return "lat_" + scenario, "bench-lat-" + scenario, scenario
}

func throughputRun(scenario string, round int) (run, group string) {
	if round > 1 {
		return fmt.Sprintf("tp_r%d_%s", round, scenario), fmt.Sprintf("bench-%s-r%d", scenario, round)
	}
	return "tp_" + scenario, "bench-" + scenario
}

// settle leaves a phase's measured window to the phase: what was written
// before it (the database and partitions just created, the backlog just
// produced, the previous scenario's tables) goes to disk now, where left in
// the page cache the kernel would write it back about 30 s later
// (vm.dirty_expire_centisecs), inside the window, with the WAL flushes
// waiting behind it (docs/benchmarks.md, "The latency tail is a writeback
// burst"); and this process (broker, mock platform, producer), which shares
// the two cores with what is measured, collects what earlier phases left
// now rather than in the window (docs/benchmarks.md, "Where those stalls
// are not").
func settle(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	syscall.Sync()
	debug.FreeOSMemory()
	return nil
}

// waitAllSuccess waits until the platform accepted n messages and every
// row is SUCCESS (q says how to count them). It watches the platform's
// counters first, which cost the database nothing, and counts rows only at
// the end.
func waitAllSuccess(ctx context.Context, c *child, mp *mockplatform.Server, pool *pgxpool.Pool, q progressSQL, n int, what string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d deliveries (platform: %+v): %w", n, mp.Stats(), ctx.Err())
		case <-tick.C:
		}
		if err := c.exited(); err != nil {
			return err
		}
		st := mp.Stats()
		if time.Since(lastLog) > 5*time.Second {
			logf("%s: %d of %d delivered", what, st.Accepted, n)
			lastLog = time.Now()
		}
		if st.Accepted < int64(n) {
			continue
		}
		var unfinished, total int
		if err := pool.QueryRow(ctx, q.Unfinished).Scan(&unfinished); err != nil {
			return err
		}
		if unfinished > 0 {
			continue
		}
		if err := pool.QueryRow(ctx, q.Total).Scan(&total); err != nil {
			return err
		}
		if total >= n {
			return nil
		}
	}
}

func topStatements(ctx context.Context, pool *pgxpool.Pool) []stmtStat {
	rows, err := pool.Query(ctx, `SELECT calls, total_exec_time, max_exec_time, rows, plans, total_plan_time, query
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time + total_plan_time DESC LIMIT 12`)
	if err != nil {
		logf("reading pg_stat_statements: %v", err)
		return nil
	}
	defer rows.Close()
	var out []stmtStat
	for rows.Next() {
		var s stmtStat
		if err := rows.Scan(&s.Calls, &s.TotalMs, &s.MaxMs, &s.Rows, &s.Plans, &s.PlanMs, &s.Query); err != nil {
			return out
		}
		s.Query = strings.Join(strings.Fields(s.Query), " ")
		if len(s.Query) > 110 {
			s.Query = s.Query[:110] + "…"
		}
		out = append(out, s)
	}
	return out
}

// cpuProfile takes a CPU profile of the forwarder once its run is under way.
func (c *child) cpuProfile(ctx context.Context, dir, scenario string, seconds int) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	return c.fetchProfile(ctx, dir, scenario, "profile", fmt.Sprintf("?seconds=%d", seconds))
}

// fetchProfile saves the forwarder's pprof profile name in dir as
// <scenario>.<name>.pprof (the CPU profile as cpu).
func (c *child) fetchProfile(ctx context.Context, dir, scenario, name, query string) error {
	file := map[string]string{"profile": "cpu"}[name]
	if file == "" {
		file = name
	}
	return c.fetch(ctx, "/debug/pprof/"+name+query, filepath.Join(dir, scenario+"."+file+".pprof"))
}

// fetch saves what the forwarder's HTTP server answers at path.
func (c *child) fetch(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.httpAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s (is http.debug_endpoints on?)", path, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	logf("wrote %s", file)
	return f.Close()
}

// latencyGCPercent is this process's GOGC during a latency phase: a
// collection a quarter as often as by default.
const latencyGCPercent = 400

func (env *benchEnv) latency(ctx context.Context, scenario string, round int) (res latencyResult, err error) {
	res.Scenario, res.Round, res.Rate, res.LoadStart = scenario, round, env.cfg.Rate, loadAvg()
	defer func() { res.LoadEnd = loadAvg() }()
	run, group, name := latencyRun(scenario, round)
	vehicle, heartbeat, err := env.createTopics(ctx, "lat-"+name)
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := env.deleteTopics(context.WithoutCancel(ctx), vehicle, heartbeat); err == nil {
			err = derr
		}
	}()
	runCtx, dsn, pool, mp, done, err := env.prepareRun(ctx, run)
	if err != nil {
		return res, err
	}
	defer done()
	profile := env.cfg.PprofDir != "" && scenario == scenarioForwarder && round == 1
	before, err := readPGCounters(ctx, pool)
	if err != nil {
		return res, fmt.Errorf("reading PostgreSQL's counters: %w", err)
	}
	vars := env.consumerEnv(dsn, mp.URL, group, vehicle, heartbeat)
	var receiver *otlpreceiver.Receiver
	if env.cfg.LatencyTraces && isForwarder(scenario) {
		// One message in 20 traced, its spans exported to this process:
		// every message traced (TRACE_SAMPLE_RATIO=1) costs the forwarder
		// and this process so much CPU at 2 000 msgs/s that the latency
		// collapses. -env TRACE_SAMPLE_RATIO=... overrides it.
		if receiver, err = otlpreceiver.Start(); err != nil {
			return res, err
		}
		defer receiver.Close()
		vars["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.URL
		vars["TRACE_SAMPLE_RATIO"] = "0.05"
	}
	c, err := env.startConsumer(runCtx, scenario, run, vars, profile)
	if err != nil {
		return res, err
	}
	defer c.Kill()
	if err := env.waitGroupStable(runCtx, group, c); err != nil {
		return res, err
	}
	if err := settle(runCtx, pool); err != nil {
		return res, fmt.Errorf("before the latency phase: %w", err)
	}
	// Collections of this process are made rarer while the phase runs (see
	// settle); the heap is small next to the machine's memory.
	defer debug.SetGCPercent(debug.SetGCPercent(latencyGCPercent))

	h := fnv.New64a()
	h.Write([]byte(scenario))
	src, err := env.newSource(vehicle, heartbeat, env.cfg.Seed^h.Sum64())
	if err != nil {
		return res, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.kafka.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		return res, err
	}
	defer cl.Close()

	rate := env.cfg.Rate
	warmupN := int(env.cfg.LatencyWarmup.Seconds() * rate)
	total := warmupN + int(env.cfg.LatencyDuration.Seconds()*rate)
	sentAt := make(map[string]time.Time, total-warmupN)
	// after: a message's predecessor of the same berth, for the split of
	// the messages that ordering makes wait.
	after := make(map[string]string, total)
	lastOfBerth := map[string]string{}
	logf("%s: producing %d messages at %.0f/s (%d of warm-up)", scenario, total, rate, warmupN)
	var (
		m         *meter
		measStart time.Time
		activity  *activitySampler
	)
	produceErr := make(chan error, 1)
	// Where the messages are, every 2 s: produced, persisted (rows),
	// unfinished rows, delivered. It tells ingest lag from dispatch lag.
	var produced atomic.Int64
	watch := periodic.Start(runCtx, periodic.Config{Interval: 2 * time.Second}, func(ctx context.Context) {
		var rows, unfinished int64
		_ = pool.QueryRow(ctx, progressOf(scenario).Watch).Scan(&rows, &unfinished)
		logf("%s: produced %d, persisted %d, unfinished %d, delivered %d", scenario, produced.Load(), rows, unfinished, mp.Stats().Accepted)
	})
	defer watch.Stop()
	start := time.Now()
	for i := 0; i < total; i++ {
		if wait := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		if i == warmupN {
			if m, err = startMeter(env.pgPID); err != nil {
				return res, err
			}
			m.attach(c.Pid(), false)
			measStart = time.Now()
			if env.cfg.LatencySamples != "" {
				if activity, err = startActivitySampler(runCtx, env.pg.DSN("postgres"), env.cfg.LatencySamples+"."+name+".activity.tsv"); err != nil {
					return res, fmt.Errorf("sampling PostgreSQL's activity: %w", err)
				}
				defer activity.stop()
			}
			if profile {
				go func() {
					path := filepath.Join(env.cfg.PprofDir, "forwarder.latency-cpu.pprof")
					if err := c.fetch(runCtx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", env.cfg.PprofSeconds), path); err != nil {
						logf("forwarder CPU profile at a steady rate: %v", err)
					}
				}()
			}
		}
		msg := src.Next()
		if i >= warmupN {
			sentAt[msg.MessageID] = time.Now()
		}
		if msg.Berth != "" && msg.MessageID != "" {
			if prev, ok := lastOfBerth[msg.Berth]; ok {
				after[msg.MessageID] = prev
			}
			lastOfBerth[msg.Berth] = msg.MessageID
		}
		produced.Add(1)
		cl.Produce(runCtx, &kgo.Record{Topic: msg.Topic, Key: msg.Key, Value: msg.Value}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case produceErr <- err:
				default:
				}
			}
		})
		if i%int(rate) == 0 {
			if err := c.exited(); err != nil {
				return res, err
			}
		}
	}
	if m == nil { // no warm-up
		return res, fmt.Errorf("latency phase produced no measured messages")
	}
	consumer, pg, self, others := m.stop()
	if activity != nil {
		if err := activity.stop(); err != nil {
			return res, fmt.Errorf("sampling PostgreSQL's activity: %w", err)
		}
	}
	measured := time.Since(measStart).Seconds()
	res.Cores, res.PGCores, res.PeakRSS = consumer.CPU/measured, pg.CPU/measured, consumer.PeakRSS
	res.SelfCores, res.OtherCores = self/measured, others/measured
	if err := cl.Flush(runCtx); err != nil {
		return res, err
	}
	select {
	case err := <-produceErr:
		return res, fmt.Errorf("producing: %w", err)
	default:
	}
	if err := waitAllSuccess(runCtx, c, mp, pool, progressOf(scenario), total, scenario); err != nil {
		return res, err
	}
	if env.cfg.LatencySamples != "" && c.httpAddr != "" {
		// The forwarder's own timings of the phase: each processor's and
		// the output's latency, end to end.
		if err := c.fetch(runCtx, "/metrics", env.cfg.LatencySamples+"."+name+".metrics.txt"); err != nil {
			return res, err
		}
	}
	_ = c.stop(45 * time.Second)
	var traced []*tracepb.Span
	if receiver != nil { // the forwarder exports its last spans as it stops
		if traced, _, err = receiver.Spans(); err != nil {
			return res, err
		}
		if err := writeSpans(traced, env.cfg.LatencySamples+"."+name+".spans.tsv"); err != nil {
			return res, err
		}
	}
	if after, err := readPGCounters(ctx, pool); err == nil {
		res.PGWork = after.sub(before)
	}
	res.Messages = total
	if env.cfg.PGStatements {
		res.Statements = topStatements(ctx, pool)
	}

	firstAt := map[string]time.Time{}
	for _, d := range mp.Deliveries() {
		firstAt[d.MessageID] = d.FirstAt
	}
	var lats, behind, free []time.Duration
	for id, t := range sentAt {
		at, ok := firstAt[id]
		if !ok {
			continue
		}
		lats = append(lats, at.Sub(t))
		if prevAt, ok := firstAt[after[id]]; ok && prevAt.After(t) {
			behind = append(behind, at.Sub(t))
		} else {
			free = append(free, at.Sub(t))
		}
	}
	if env.cfg.LatencySamples != "" {
		if err := writeLatencySamples(env.cfg.LatencySamples+"."+name+".tsv", sentAt, firstAt); err != nil {
			return res, err
		}
	}
	if receiver != nil {
		logSpanSteps(scenario, traced, sentAt, firstAt, 50*time.Millisecond)
	}
	if len(lats) == 0 {
		return res, fmt.Errorf("no measured message was delivered")
	}
	res.Measured = len(lats)
	res.P50, res.P90, res.P99, res.Max = quantile(lats, 0.50), quantile(lats, 0.90), quantile(lats, 0.99), quantile(lats, 1)
	res.Behind = float64(len(behind)) / float64(len(lats))
	res.P99Behind, res.P99Free = quantile(behind, 0.99), quantile(free, 0.99)
	return res, nil
}

// writeLatencySamples writes one line per delivered measured message: when
// it was produced (Unix microseconds), its latency (microseconds) and its
// messageId, in the order produced, to see when the tail happened.
func writeLatencySamples(path string, sentAt, firstAt map[string]time.Time) error {
	type sample struct {
		sent, lat int64
		id        string
	}
	var ss []sample
	for id, t := range sentAt {
		if at, ok := firstAt[id]; ok {
			ss = append(ss, sample{t.UnixMicro(), at.Sub(t).Microseconds(), id})
		}
	}
	slices.SortFunc(ss, func(a, b sample) int { return cmp.Compare(a.sent, b.sent) })
	var b strings.Builder
	b.WriteString("sent_unix_us\tlatency_us\tmessage_id\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "%d\t%d\t%s\n", s.sent, s.lat, s.id)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// waitGroupStable waits until the consumer group has a member with its
// partitions assigned, so that the latency phase does not measure the
// group join. A consumer that does not show up as a classic group member is
// given 10 s.
func (env *benchEnv) waitGroupStable(ctx context.Context, group string, c *child) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.exited(); err != nil {
			return err
		}
		gs, err := env.admin.DescribeGroups(ctx, group)
		if err == nil {
			if g, ok := gs[group]; ok && g.State == "Stable" && len(g.Members) > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	logf("consumer group %s not seen stable after 10s; measuring anyway", group)
	return nil
}
