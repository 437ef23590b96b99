package e2e_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

const (
	topicVehicle   = eventgen.DefaultVehicleTopic
	topicHeartbeat = eventgen.DefaultHeartbeatTopic
	partitions     = 3

	accessName = "e2e-parking-operator"
	// accessPwd is distinctive enough that finding it anywhere (a log line, a
	// row) can only mean it leaked.
	accessPwd = "Pw-e2e-LEAKCHECK-7Kq9xZ2mTb4R"

	// shutdownTimeout is the pipeline's shutdown_timeout (SHUTDOWN_TIMEOUT).
	shutdownTimeout = 10 * time.Second
)

// stackOptions tune one scenario's stack.
type stackOptions struct {
	// cluster is a private PostgreSQL server; nil uses the package's.
	cluster *pgcluster.Cluster
	// emptyDB leaves the database without the schema, for the forwarders to
	// create when they start.
	emptyDB bool
	// database is a database the scenario made itself (a superuser URL):
	// used as it is, neither created nor migrated.
	database string
	// env overrides the forwarders' environment.
	env map[string]string
	// faults are the mock platform's initial faults.
	faults mockplatform.Faults
	// accessName and accessPwd replace the platform credentials (the
	// forwarders' PLATFORM_ACCESS_NAME and PLATFORM_ACCESS_PWD, and what the
	// mock platform checks); empty keeps accessName and accessPwd.
	accessName, accessPwd string
}

// stack is one scenario's world: its own database, Kafka cluster (with both
// topics, 3 partitions each), mock platform and consumer group, and the
// forwarder processes it started. Kafka and the platform live in the test
// process, so they outlive any forwarder the scenario kills.
type stack struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	dsn      string
	pool     *pgxpool.Pool
	kafka    *kafkatest.Cluster
	producer *kgo.Client
	platform *mockplatform.Server
	group    string
	env      map[string]string
	exp      *expected
	// accessName and accessPwd are the platform credentials of the
	// scenario; the password is searched for in every log and row.
	accessName, accessPwd string
	// allowAuthFailures accepts 401 answers at the platform (a scenario that
	// runs a forwarder with a wrong password on purpose).
	allowAuthFailures bool

	mu    sync.Mutex
	procs []*proc
}

// newStack builds a scenario's stack; nothing is started until start.
func newStack(t *testing.T, opts stackOptions) *stack {
	t.Helper()
	s := &stack{t: t, seed: scenarioSeed(t), exp: newExpected(),
		accessName: cmp.Or(opts.accessName, accessName), accessPwd: cmp.Or(opts.accessPwd, accessPwd)}
	s.rng = rand.New(rand.NewPCG(s.seed, s.seed^0x5bd1e995))
	t.Logf("seed %d (E2E_SEED=%d reproduces the scenario's choices)", s.seed, baseSeed)

	switch {
	case opts.database != "":
		s.dsn = opts.database
	case opts.cluster != nil:
		s.dsn = pgtest.NewDBOn(t, opts.cluster)
	case opts.emptyDB:
		s.dsn = pgtest.NewEmptyDB(t)
	default:
		s.dsn = pgtest.NewDB(t)
	}
	pool, err := pgxpool.New(context.Background(), s.dsn)
	if err != nil {
		t.Fatalf("opening the scenario's database: %v", err)
	}
	t.Cleanup(pool.Close)
	s.pool = pool

	s.kafka = kafkatest.New(t, []kafkatest.Topic{
		{Name: topicVehicle, Partitions: partitions},
		{Name: topicHeartbeat, Partitions: partitions},
	})
	s.producer = s.kafka.Client(t,
		kgo.ProducerLinger(2*time.Millisecond),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.MaxBufferedRecords(50_000),
	)

	s.platform, err = mockplatform.Start(mockplatform.Config{
		AccessName: s.accessName,
		AccessPwd:  s.accessPwd,
		Faults:     opts.faults,
		Seed:       s.seed,
		// Every berth's requests, in order, for the ordering checks.
		RecordBerths: true,
	})
	if err != nil {
		t.Fatalf("starting the mock platform: %v", err)
	}
	t.Cleanup(func() { _ = s.platform.Close() })

	s.group = "e2e-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	s.env = map[string]string{
		"KAFKA_BROKERS":         s.kafka.Brokers(),
		"KAFKA_GROUP":           s.group,
		"KAFKA_TOPIC_VEHICLE":   topicVehicle,
		"KAFKA_TOPIC_HEARTBEAT": topicHeartbeat,
		"DATABASE_URL":          s.dsn,
		"PLATFORM_URL":          s.platform.URL,
		"PLATFORM_ACCESS_NAME":  s.accessName,
		"PLATFORM_ACCESS_PWD":   s.accessPwd,
		"FORWARD_RETRY_INITIAL": "200ms",
		"FORWARD_RETRY_MAX":     "2s",
		"CLAIM_LEASE":           "3s",
		"FORWARD_TIMEOUT":       "1s",
		"FORWARD_MAX_ATTEMPTS":  "50",
		"SHUTDOWN_TIMEOUT":      shutdownTimeout.String(),
		"LOG_LEVEL":             "INFO",
	}
	for k, v := range opts.env {
		s.env[k] = v
	}

	// Registered before any process starts, so it runs after every process
	// has been killed (cleanups run last in, first out).
	t.Cleanup(s.checkLogsForPassword)
	return s
}

// start runs one more forwarder with the stack's environment plus extra and
// waits until it answers /ping.
func (s *stack) start(name string, extra map[string]string) *proc {
	s.t.Helper()
	return s.startBuild(name, current(s.t), extra)
}

// startBuild is start with the forwarder b.
func (s *stack) startBuild(name string, b build, extra map[string]string) *proc {
	s.t.Helper()
	p := startBuild(s.t, name, b, mergeEnv(s.env, extra))
	s.track(p)
	p.waitUp(s.t, 60*time.Second)
	return p
}

// track adds procs to the stack's processes, which it stops when the test
// ends and whose logs it checks.
func (s *stack) track(procs ...*proc) {
	s.mu.Lock()
	s.procs = append(s.procs, procs...)
	s.mu.Unlock()
}

// awaitExit waits up to d for p, a forwarder expected to exit by itself (a
// refused start-up), tracked with the stack's processes.
func (s *stack) awaitExit(p *proc, d time.Duration) (code int, exited bool) {
	p.mayExit = true
	s.track(p)
	return p.waitExit(d)
}

// startAll runs one forwarder per name with the stack's environment, all
// at once, and waits until each answers /ping.
func (s *stack) startAll(names ...string) []*proc {
	s.t.Helper()
	procs := make([]*proc, len(names))
	for i, name := range names {
		procs[i] = startProc(s.t, name, s.env)
	}
	s.track(procs...)
	for _, p := range procs {
		p.waitUp(s.t, 60*time.Second)
	}
	return procs
}

// checkLogsForPassword fails the test if any process ever wrote the
// platform password (docs/guarantees.md #11: never logged).
func (s *stack) checkLogsForPassword() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if n := p.countLines(s.accessPwd); n > 0 {
			s.t.Errorf("%s logged the platform password on %d lines (%s)", p.name, n, p.logPath)
		}
	}
}

// assertNoUnexpectedExit fails the test when a process exited without
// being told to.
func (s *stack) assertNoUnexpectedExit() {
	s.t.Helper()
	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	for _, p := range procs {
		if p.Exited() && p.signalled.Load() == 0 && !p.mayExit {
			s.t.Fatalf("%s (pid %d) exited by itself (%v):\n%s", p.name, p.Pid(), p.Err(), p.tail(6000))
		}
	}
}

// dumpLogs writes the tail of every process's log into the test output.
func (s *stack) dumpLogs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		s.t.Logf("--- %s (pid %d, %s) log tail:\n%s", p.name, p.Pid(), p.state(), p.tail(4000))
	}
}

// produce makes n messages with src and writes them to Kafka, recording
// what each must become.
func (s *stack) produce(src *eventgen.Source, n int) {
	s.t.Helper()
	if err := s.tryProduce(src, n); err != nil {
		s.t.Fatal(err)
	}
}

// produceAsync is produce in the background; wait returns its error.
func (s *stack) produceAsync(src *eventgen.Source, n int) (wait func() error) {
	done := make(chan error, 1)
	go func() { done <- s.tryProduce(src, n) }()
	return func() error { return <-done }
}

func (s *stack) tryProduce(src *eventgen.Source, n int) error {
	const chunk = 1000
	msgs := make([]eventgen.Message, 0, chunk)
	for done := 0; done < n; {
		msgs = msgs[:0]
		for len(msgs) < chunk && done < n {
			msgs = append(msgs, src.Next())
			done++
		}
		recs := make([]*kgo.Record, len(msgs))
		for i, m := range msgs {
			recs[i] = &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}
		}
		if err := s.tryProduceRecords(recs); err != nil {
			return err
		}
		for i, m := range msgs {
			s.exp.add(m, recs[i])
		}
	}
	return nil
}

// produceRecords writes records synchronously; their Partition and Offset
// are set on return.
func (s *stack) produceRecords(recs ...*kgo.Record) {
	s.t.Helper()
	if err := s.tryProduceRecords(recs); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) tryProduceRecords(recs []*kgo.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing %d records: %w", len(recs), err)
	}
	return nil
}

// newSource is a message source seeded from the scenario's seed.
func (s *stack) newSource(cfg eventgen.SourceConfig) *eventgen.Source {
	s.t.Helper()
	cfg.VehicleTopic, cfg.HeartbeatTopic = topicVehicle, topicHeartbeat
	if cfg.Seed == 0 {
		cfg.Seed = s.rng.Uint64() | 1
	}
	src, err := eventgen.NewSource(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return src
}

// rowCounts returns the number of rows by status. It counts the tables, not
// the forward_records view, as every poll of the suite does: the view looks
// up each delivered message's SUCCESS attempt (130-300 ms at 30 000 rows),
// and the scenarios poll every 100 ms, side by side. The counts are the
// view's: a message without a delivery state is delivered
// (docs/architecture.md, "The data model"), in one snapshot.
func (s *stack) rowCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT status, count(*) FROM forward_deliveries GROUP BY status
		UNION ALL
		SELECT 'SUCCESS', (SELECT count(*) FROM forward_messages) - (SELECT count(*) FROM forward_deliveries)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		if n != 0 {
			out[st] = n
		}
	}
	return out, rows.Err()
}

func total(c map[string]int) int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// waitUntil polls cond every 100 ms until it holds, failing the test after
// within (a generous bound, never an assertion on speed) or when a process
// exited by itself. cond's string says where things stand, for the failure.
func (s *stack) waitUntil(what string, within time.Duration, cond func(ctx context.Context) (bool, string)) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, state := cond(ctx)
		cancel()
		if ok {
			return
		}
		if state != "" {
			last = state
		}
		s.assertNoUnexpectedExit()
		if time.Now().After(deadline) {
			s.dumpLogs()
			s.t.Fatalf("gave up after %s waiting for %s; last state: %s", within, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSettled waits until every expected row exists and none is PENDING or
// IN_PROGRESS.
func (s *stack) waitSettled(within time.Duration) {
	s.t.Helper()
	want := s.exp.rows()
	s.waitUntil(fmt.Sprintf("all %d rows SUCCESS or FAILED", want), within, func(ctx context.Context) (bool, string) {
		c, err := s.rowCounts(ctx)
		if err != nil {
			return false, "reading rows: " + err.Error()
		}
		done := total(c) >= want && c["PENDING"] == 0 && c["IN_PROGRESS"] == 0
		state := fmt.Sprintf("rows %v (want %d), platform %+v", c, want, s.platform.Stats())
		if !done {
			// Rows whose lease ran out well ago and that nobody claimed
			// again: a dispatcher that stopped claiming.
			var stale int
			if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_deliveries
				WHERE status IN ('PENDING', 'IN_PROGRESS') AND next_retry_at < now() - interval '10 seconds'`).Scan(&stale); err == nil {
				state += fmt.Sprintf("; %d rows due for over 10 s and not claimed", stale)
			}
		}
		return done, state
	})
}

// progress is rows persisted plus deliveries accepted: it goes from 0 to
// twice the number of good messages plus the bad ones as a run completes.
func (s *stack) progress(ctx context.Context) int {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_messages`).Scan(&n); err != nil {
		return -1
	}
	return n + int(s.platform.Stats().Accepted)
}

var (
	baseSeed     uint64
	baseSeedOnce sync.Once
)

// scenarioSeed derives a scenario's seed from E2E_SEED (or the clock) and
// its name, so one E2E_SEED reproduces every scenario's choices.
func scenarioSeed(t *testing.T) uint64 {
	baseSeedOnce.Do(func() {
		if v, err := strconv.ParseUint(os.Getenv("E2E_SEED"), 10, 64); err == nil && v != 0 {
			baseSeed = v
		} else {
			baseSeed = uint64(time.Now().UnixNano())
		}
	})
	h := baseSeed
	for _, c := range t.Name() {
		h = h*1099511628211 + uint64(c)
	}
	return h | 1
}
