package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

// The scale check: bulk-load millions of finished rows with COPY and
// measure what must not grow with them: the claim (claim.sql) and the
// record-gauge refresh (gauges.sql), plus, for the operator, `outbox stats`,
// `outbox show` and `outbox find --plate`.
// The same measurements on an empty table are printed beside them.
//
//	go run ./test/bench scale -rows 10000000
//	go run ./test/bench scale -rows 10000000 -dir /tmp/scale -keep   # reuse the load next time

type scaleConfig struct {
	Rows        int
	FailedShare float64
	Backlog     int
	ClaimBatch  int
	Churn       int
	Drain       int
	pgVersion   string
	Logs        bool
	Dir, DSN    string
	Keep        bool
	Workers     int
	Seed        uint64
	// ExplainClaim prints the whole plan of one claim of each
	// measurement, with its times and buffers.
	ExplainClaim bool
}

// scaleResult is one measurement: a table size and state.
type scaleResult struct {
	Label         string
	Finished      int64
	DeadTuples    int64
	TableBytes    int64
	ClaimP50      time.Duration
	ClaimP95      time.Duration
	ClaimScanBufs int64
	RecordP50     time.Duration
	GaugesP50     time.Duration
	GaugesP95     time.Duration
	GaugesBuffers int64
	GaugeSource   outboxdb.SuccessSource
	StatsDuration time.Duration
	// ShowP50 and FindP50 are `outbox show <key>` and `outbox find
	// --plate` (outboxdb.ShowRecord and Find, default limit).
	ShowP50, FindP50 time.Duration
	// Partitions is how many partitions forward_messages has.
	Partitions     int
	LoadDuration   time.Duration
	VacuumDuration time.Duration
	ChurnPerSec    float64
	// Drain is the claim time by tenth of a backlog drained in one go
	// (first tenth first), and DrainPerSec its claim + record rate.
	Drain       []time.Duration
	DrainPerSec float64
}

func runScale(ctx context.Context, args []string) error {
	var c scaleConfig
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.IntVar(&c.Rows, "rows", 10_000_000, "finished rows to load")
	fs.Float64Var(&c.FailedShare, "failed-share", 0.001, "share of the finished rows that are FAILED (the rest SUCCESS)")
	fs.IntVar(&c.Backlog, "backlog", 10_000, "PENDING rows to claim during each measurement")
	fs.IntVar(&c.ClaimBatch, "claim-batch", 100, "rows per claim (outbox_retry's default batch_size)")
	fs.IntVar(&c.Churn, "churn", 200_000, "rows pushed through insert, claim and SUCCESS between the two measurements of each size, without VACUUM (the state between two autovacuums)")
	fs.IntVar(&c.Drain, "drain", 200_000, "after the measurements of each size, a backlog of this many rows is drained by claims of 500 and the claim time followed (0: skip)")
	fs.BoolVar(&c.Logs, "logs", false, "also write the attempt of each FAILED row (a delivered row always has its SUCCESS attempt)")
	fs.StringVar(&c.Dir, "dir", "", "PostgreSQL cluster directory; an existing load in it is reused (default: a temporary directory)")
	fs.StringVar(&c.DSN, "dsn", "", "use this database instead of a private cluster (its outbox is loaded if it holds fewer messages than -rows)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the private cluster's directory")
	fs.IntVar(&c.Workers, "copy-workers", 2, "concurrent COPY streams")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the payloads")
	fs.BoolVar(&c.ExplainClaim, "explain-claim", false, "print EXPLAIN (ANALYZE, BUFFERS) of one claim of each measurement")
	if err := fs.Parse(args); err != nil {
		return err
	}

	var emptyDSN, bigDSN string
	if c.DSN == "" {
		pg, stop, err := privateCluster(ctx, c.Dir, "forwarder-scale-", c.Keep, pgcluster.Config{Settings: map[string]string{
			// Room for the bulk load without checkpoints every few seconds.
			"max_wal_size": "8GB", "maintenance_work_mem": "512MB",
		}})
		if err != nil {
			return err
		}
		defer stop()
		for _, db := range []string{"scale_empty", "scale"} {
			if err := ensureDB(ctx, pg, db); err != nil {
				return err
			}
		}
		emptyDSN, bigDSN = pg.DSN("scale_empty"), pg.DSN("scale")
	} else {
		bigDSN = c.DSN
	}

	var results []scaleResult
	if emptyDSN != "" {
		rs, err := scaleSize(ctx, &c, emptyDSN, false)
		if err != nil {
			return fmt.Errorf("measuring the empty table: %w", err)
		}
		results = append(results, rs...)
	}
	rs, err := scaleSize(ctx, &c, bigDSN, true)
	if err != nil {
		return err
	}
	results = append(results, rs...)
	fmt.Println()
	fmt.Println(scaleMarkdown(c, results))
	return nil
}

func ensureDB(ctx context.Context, pg *pgcluster.Cluster, name string) error {
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	}
	return err
}

// scaleSize loads the table (when load is set), vacuums it, measures, pushes
// c.Churn rows through the outbox without vacuuming and measures again.
func scaleSize(ctx context.Context, c *scaleConfig, dsn string, load bool) ([]scaleResult, error) {
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: int32(c.Workers + 2), ApplicationName: "forwarder-bench-scale"})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := outboxdb.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	c.pgVersion = serverVersion(ctx, pool)
	// Leftovers of an earlier measurement on a reused load.
	if err := removeMeasured(ctx, pool); err != nil {
		return nil, err
	}
	var (
		first    scaleResult
		finished int64
	)
	if err := ensureLoadPartitions(ctx, pool); err != nil {
		return nil, err
	}
	if load {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_messages`).Scan(&finished); err != nil {
			return nil, err
		}
		if finished < int64(c.Rows) {
			if first.LoadDuration, err = copyFinished(ctx, pool, *c, int(finished)); err != nil {
				return nil, err
			}
		}
	}
	logf("VACUUM (ANALYZE) of the outbox's tables")
	start := time.Now()
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) forward_messages, forward_deliveries, forward_retry_logs`); err != nil {
		return nil, err
	}
	first.VacuumDuration = time.Since(start)
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_messages`).Scan(&finished); err != nil {
		return nil, err
	}

	first.Label = "after VACUUM"
	if err := scaleMeasure(ctx, *c, pool, "backlog-a-", &first); err != nil {
		return nil, err
	}
	start = time.Now()
	if err := churn(ctx, pool, c.Churn, 500); err != nil {
		return nil, fmt.Errorf("churning: %w", err)
	}
	second := scaleResult{Label: fmt.Sprintf("after %d more deliveries, no VACUUM", c.Churn), ChurnPerSec: float64(c.Churn) / time.Since(start).Seconds()}
	if err := scaleMeasure(ctx, *c, pool, "backlog-b-", &second); err != nil {
		return nil, err
	}
	if c.Drain > 0 {
		if second.Drain, second.DrainPerSec, err = drain(ctx, pool, c.Drain, 500); err != nil {
			return nil, fmt.Errorf("draining: %w", err)
		}
	}
	first.Finished, second.Finished = finished, finished+int64(c.Churn)
	if !load {
		first.Finished, second.Finished = 0, int64(c.Churn)
	}
	// Remove what the measurement added, so that a reused load stays as loaded.
	if err := removeMeasured(ctx, pool); err != nil {
		return nil, err
	}
	return []scaleResult{first, second}, nil
}

// removeMeasured deletes the messages a measurement added (backlog and
// churn), their delivery rows and attempts.
func removeMeasured(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `WITH d AS (
		DELETE FROM forward_deliveries WHERE message_key LIKE 'backlog-%' OR message_key LIKE 'churn-%'
	), m AS (
		DELETE FROM forward_messages WHERE message_key LIKE 'backlog-%' OR message_key LIKE 'churn-%'
		RETURNING id, created_at
	)
	DELETE FROM forward_retry_logs l USING m WHERE l.record_id = m.id AND l.record_created_at = m.created_at`)
	if err != nil {
		return fmt.Errorf("removing the rows of an earlier measurement: %w", err)
	}
	return nil
}

// churn pushes n rows through the outbox the way the service does: inserted
// PENDING in batches, claimed and recorded SUCCESS, leaving the dead row
// versions and index entries that autovacuum would later remove.
func churn(ctx context.Context, pool *pgxpool.Pool, n, batch int) error {
	logf("pushing %d rows through insert, claim and record", n)
	recs := make([]outboxdb.NewRecord, batch)
	for done := 0; done < n; done += batch {
		for i := range recs {
			recs[i] = outboxdb.NewRecord{MessageKey: fmt.Sprintf("churn-%d", done+i), APIType: "HEARTBEAT", KafkaTopic: "t",
				KafkaOffset: int64(done + i), Payload: []byte(`{"deviceId":"CAM-0001"}`), Status: outboxdb.StatusPending}
		}
		if _, err := outboxdb.InsertBatchCount(ctx, pool, recs); err != nil {
			return err
		}
		if err := claimAndRecord(ctx, pool, batch, nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// claimAndRecord claims up to limit rows and records them SUCCESS, timing
// both statements when claims and records are given.
func claimAndRecord(ctx context.Context, pool *pgxpool.Pool, limit int, claims, records *[]time.Duration) error {
	start := time.Now()
	res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: limit, Lease: time.Minute, Claimer: "scale", MaxAttempts: 5})
	if err != nil {
		return err
	}
	if len(res.Claimed) == 0 {
		return errNothingDue
	}
	if claims != nil {
		*claims = append(*claims, time.Since(start))
	}
	results := make([]outboxdb.Result, len(res.Claimed))
	for i, row := range res.Claimed {
		results[i] = outboxdb.Result{ID: row.ID, ClaimToken: row.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
	}
	start = time.Now()
	if _, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{}); err != nil {
		return err
	}
	if records != nil {
		*records = append(*records, time.Since(start))
	}
	return nil
}

var errNothingDue = errors.New("nothing was due")

// drain inserts a backlog of n PENDING rows at once (a platform outage
// ending) and claims and records it in batches, returning the median claim
// time of each tenth of the drain.
func drain(ctx context.Context, pool *pgxpool.Pool, n, batch int) ([]time.Duration, float64, error) {
	logf("draining a backlog of %d rows", n)
	recs := make([]outboxdb.NewRecord, 1000)
	for done := 0; done < n; done += len(recs) {
		recs = recs[:min(len(recs), n-done)]
		for i := range recs {
			recs[i] = outboxdb.NewRecord{MessageKey: fmt.Sprintf("churn-drain-%d", done+i), APIType: "HEARTBEAT", KafkaTopic: "t",
				KafkaOffset: int64(done + i), Payload: []byte(`{"deviceId":"CAM-0001"}`), Status: outboxdb.StatusPending}
		}
		if _, err := outboxdb.InsertBatchCount(ctx, pool, recs); err != nil {
			return nil, 0, err
		}
	}
	var claims []time.Duration
	start := time.Now()
	for {
		err := claimAndRecord(ctx, pool, batch, &claims, nil)
		if errors.Is(err, errNothingDue) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	tenths := make([]time.Duration, 0, 10)
	for i := range 10 {
		part := claims[i*len(claims)/10 : (i+1)*len(claims)/10]
		if len(part) > 0 {
			tenths = append(tenths, quantile(part, 0.5))
		}
	}
	return tenths, rate, nil
}

// scaleMeasure times the gauge refresh and the claims of a fresh backlog.
func scaleMeasure(ctx context.Context, c scaleConfig, pool *pgxpool.Pool, prefix string, r *scaleResult) error {
	// The messages' and attempts' partitions and the delivery state, with
	// their indexes.
	if err := pool.QueryRow(ctx, `WITH rels AS (
			SELECT relid FROM pg_partition_tree('forward_messages') WHERE isleaf
			UNION ALL
			SELECT relid FROM pg_partition_tree('forward_retry_logs') WHERE isleaf
			UNION ALL
			SELECT 'forward_deliveries'::regclass
		)
		SELECT coalesce(sum(pg_total_relation_size(rels.relid)), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint
		FROM rels LEFT JOIN pg_stat_user_tables s ON s.relid = rels.relid`).Scan(&r.TableBytes, &r.DeadTuples); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_partition_tree('forward_messages') WHERE isleaf`).Scan(&r.Partitions); err != nil {
		return err
	}
	logf("measuring %s (%s with indexes, %d dead row versions)", r.Label, mib(r.TableBytes), r.DeadTuples)

	// The backlog the claims take, due now, as the outbox processor writes it.
	backlog := make([]outboxdb.NewRecord, c.Backlog)
	for i := range backlog {
		backlog[i] = outboxdb.NewRecord{MessageKey: fmt.Sprintf("%s%d", prefix, i), APIType: "HEARTBEAT", KafkaTopic: "t",
			KafkaOffset: int64(i), Payload: []byte(`{"deviceId":"CAM-0001"}`), Status: outboxdb.StatusPending,
			PlateNo: scalePlate(int64(i))}
	}
	for i := 0; i < len(backlog); i += 500 {
		if _, err := outboxdb.InsertBatchCount(ctx, pool, backlog[i:min(i+500, len(backlog))]); err != nil {
			return err
		}
	}

	// Buffers of the claim's scan (the due CTE: index walk and row locks)
	// and of the whole gauge statement, from one EXPLAIN each, rolled back.
	var err error
	if r.ClaimScanBufs, err = explainBuffers(ctx, pool, "due", outboxdb.ClaimSQL(), c.ClaimBatch, int64(60_000), "scale", 5, int64(-1)); err != nil {
		return fmt.Errorf("explaining the claim: %w", err)
	}
	if c.ExplainClaim {
		plan, err := explainText(ctx, pool, outboxdb.ClaimSQL(), c.ClaimBatch, int64(60_000), "scale", 5, int64(-1))
		if err != nil {
			return fmt.Errorf("explaining the claim: %w", err)
		}
		logf("the claim's plan (%s):\n%s", r.Label, plan)
	}
	if r.GaugesBuffers, err = explainBuffers(ctx, pool, "", outboxdb.RecordGaugesSQL()); err != nil {
		return fmt.Errorf("explaining the gauges: %w", err)
	}

	var claims, records, gauges []time.Duration
	for range 20 {
		start := time.Now()
		g, err := outboxdb.ReadRecordGauges(ctx, pool, outboxdb.GaugeOptions{})
		if err != nil {
			return err
		}
		gauges = append(gauges, time.Since(start))
		r.GaugeSource = g.SuccessSource
	}
	for {
		err := claimAndRecord(ctx, pool, c.ClaimBatch, &claims, &records)
		if errors.Is(err, errNothingDue) {
			break
		}
		if err != nil {
			return err
		}
	}
	if len(claims) == 0 {
		return errors.New("nothing was claimed")
	}
	r.ClaimP50, r.ClaimP95 = quantile(claims, 0.5), quantile(claims, 0.95)
	r.RecordP50 = quantile(records, 0.5)
	r.GaugesP50, r.GaugesP95 = quantile(gauges, 0.5), quantile(gauges, 0.95)

	start := time.Now()
	if _, err := outboxdb.ReadStats(ctx, pool, outboxdb.StatsOptions{RequeueRounds: 3}); err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	r.StatsDuration = time.Since(start)

	// The operator's lookups, 20 of each: a row of the backlog by its key
	// (it stands in both tables), and a plate that the backlog and, on the
	// loaded table, the finished rows carry.
	var shows, finds []time.Duration
	for k := range 20 {
		i := int64(k) * int64(c.Backlog) / 20
		start := time.Now()
		if _, err := outboxdb.ShowRecord(ctx, pool, fmt.Sprintf("%s%d", prefix, i), outboxdb.LookupOptions{}); err != nil {
			return fmt.Errorf("outbox show: %w", err)
		}
		shows = append(shows, time.Since(start))
		start = time.Now()
		found, err := outboxdb.Find(ctx, pool, outboxdb.FindFilter{Plate: scalePlate(i)}, outboxdb.LookupOptions{})
		if err != nil {
			return fmt.Errorf("outbox find --plate: %w", err)
		}
		if len(found) == 0 {
			return fmt.Errorf("outbox find --plate %s found nothing", scalePlate(i))
		}
		finds = append(finds, time.Since(start))
	}
	r.ShowP50, r.FindP50 = quantile(shows, 0.5), quantile(finds, 0.5)
	return nil
}

// scalePlates is how many plates the loaded rows and the backlogs share:
// at 10 M rows, 40 rows a plate plus those of the backlog.
const scalePlates = 200_000

// scalePlate is the plate of row i of a load or a backlog.
func scalePlate(i int64) string { return fmt.Sprintf("SC%06d", i%scalePlates) }

// explainText runs EXPLAIN (ANALYZE, BUFFERS) of a statement in a
// transaction it rolls back and returns the plan as text.
func explainText(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// explainBuffers runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of a statement
// in a transaction it rolls back and returns the shared buffers (hit + read)
// of the plan node that scans CTE cte, or of the whole plan when cte is "".
func explainBuffers(ctx context.Context, pool *pgxpool.Pool, cte, sql string, args ...any) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	var plan []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		return 0, err
	}
	if len(plan) == 0 {
		return 0, errors.New("empty plan")
	}
	top, _ := plan[0]["Plan"].(map[string]any)
	node := top
	if cte != "" {
		node = findCTE(top, cte)
		if node == nil {
			return 0, fmt.Errorf("no CTE %s in the plan", cte)
		}
	}
	num := func(k string) float64 { v, _ := node[k].(float64); return v }
	return int64(num("Shared Hit Blocks") + num("Shared Read Blocks")), nil
}

// findCTE finds the plan of CTE name (the "CTE name" subplan).
func findCTE(n map[string]any, name string) map[string]any {
	if n["Subplan Name"] == "CTE "+name {
		return n
	}
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			if f := findCTE(m, name); f != nil {
				return f
			}
		}
	}
	return nil
}

// quantile is the q-quantile of ds, 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// finishedSource feeds COPY with finished rows: SUCCESS (a FAILED share
// aside), created over the last 30 days, with realistic payloads. They are
// copied as one wide row each into a staging table and moved from there to
// the outbox's tables (loadStagedSQL).
type finishedSource struct {
	c        scaleConfig
	next     *atomic.Int64
	end      int64
	payloads [][]byte
	row      []any
	now      time.Time
	err      error
	i        int64
	chunk    int64
	chunkEnd int64
}

// stagingTable holds one COPY's finished rows until loadStagedSQL moves
// them; its rows go at commit.
const stagingTable = `CREATE TEMP TABLE IF NOT EXISTS scale_staging (
	message_key text, api_type text, kafka_topic text, kafka_partition integer, kafka_offset bigint,
	kafka_key bytea, payload bytea, status text, attempt_count integer, next_retry_at timestamptz,
	last_http_status integer, last_error text, created_at timestamptz, updated_at timestamptz,
	succeeded_at timestamptz, plate_no text) ON COMMIT DELETE ROWS`

// loadStagedSQL moves the staged rows into the outbox as the service would
// have left them (docs/architecture.md, the data model): every message; a
// delivery row for each FAILED one; the SUCCESS attempt of each delivered
// one, which says when and by whom; with $1, the last attempt of each FAILED
// one as well.
const loadStagedSQL = `WITH m AS (
	INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
	                              kafka_key, payload, created_at, plate_no)
	SELECT message_key, api_type, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload, created_at, plate_no
	FROM scale_staging
	RETURNING id, created_at, message_key, octet_length(payload) AS payload_size
), d AS (
	INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, payload_size,
	                                last_http_status, last_error, updated_at, failure_class, failed_at)
	SELECT m.id, m.created_at, m.message_key, 'FAILED', s.attempt_count, m.payload_size,
	       s.last_http_status, s.last_error, s.updated_at, 'REJECTED', s.updated_at
	FROM m JOIN scale_staging s ON s.message_key = m.message_key
	WHERE s.status = 'FAILED'
)
INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status,
                                error_message, duration_ms, attempted_at, attempted_by)
SELECT m.id, m.created_at, s.attempt_count, s.status, s.last_http_status, s.last_error, 12, s.updated_at, 'scale'
FROM m JOIN scale_staging s ON s.message_key = m.message_key
WHERE s.status = 'SUCCESS' OR $1::boolean`

var finishedColumns = []string{"message_key", "api_type", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_key",
	"payload", "status", "attempt_count", "next_retry_at", "last_http_status", "last_error", "created_at", "updated_at", "succeeded_at", "plate_no"}

func (s *finishedSource) Next() bool {
	if s.i >= s.chunkEnd {
		s.i = s.next.Add(s.chunk) - s.chunk
		s.chunkEnd = min(s.i+s.chunk, s.end)
		if s.i >= s.end {
			return false
		}
	}
	i := s.i
	s.i++
	// In float: (end-i) × 30 days in nanoseconds overflows an int64 beyond
	// ~3 500 rows.
	created := s.now.Add(-time.Duration(float64(30*24*time.Hour) * float64(s.end-i) / float64(s.end)))
	done := created.Add(40 * time.Millisecond)
	status, lastErr, httpStatus, succeeded := "SUCCESS", any(nil), any(int32(200)), any(done)
	if s.c.FailedShare > 0 && i%int64(1/s.c.FailedShare) == 0 {
		status, lastErr, httpStatus, succeeded = "FAILED", "platform errcode 998: do not resend", int32(200), nil
	}
	api, topic, plate := "VEHICLE_EVENT", "device-vehicle-event", any(scalePlate(i))
	if i%5 == 4 {
		api, topic, plate = "HEARTBEAT", "device-heartbeat", nil
	}
	s.row = []any{
		fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", uint32(i>>16), uint16(i), uint16(i>>4)&0xfff, uint16(i)&0xfff, i),
		api, topic, int32(i % 3), i / 3, []byte("CAM-0001"),
		s.payloads[i%int64(len(s.payloads))], status, int32(1), nil, httpStatus, lastErr, created, done, succeeded, plate,
	}
	return true
}

func (s *finishedSource) Values() ([]any, error) { return s.row, nil }
func (s *finishedSource) Err() error             { return s.err }

// ensureLoadPartitions creates the daily partitions of the 30 days a load's
// rows are created over. The empty table gets them too: the claim and the
// lookups probe every partition kept, so their cost follows the partitions
// as well as the rows, and the two tables are compared at the same count.
func ensureLoadPartitions(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `SELECT forward_partition_ensure($1::timestamptz - interval '31 days', $1::timestamptz + interval '1 day', interval '1 day')`, time.Now()); err != nil {
		return fmt.Errorf("creating the partitions of the load: %w", err)
	}
	return nil
}

// copyFinished loads rows from..c.Rows with c.Workers concurrent COPYs.
func copyFinished(ctx context.Context, pool *pgxpool.Pool, c scaleConfig, from int) (time.Duration, error) {
	src, err := eventgen.NewSource(eventgen.SourceConfig{Seed: c.Seed})
	if err != nil {
		return 0, err
	}
	payloads := make([][]byte, 4096)
	for i := range payloads {
		payloads[i] = src.Next().Value
	}
	logf("loading %d finished rows with COPY (%d streams)", c.Rows-from, c.Workers)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		copied   atomic.Int64
	)
	next.Store(int64(from))
	start := time.Now()
	progress := periodic.Start(ctx, periodic.Config{Interval: 10 * time.Second}, func(context.Context) {
		n := next.Load() - int64(from)
		logf("  ~%d rows handed to COPY (%.0f rows/s)", n, float64(n)/time.Since(start).Seconds())
	})
	defer progress.Stop()
	if err := ensureLoadPartitions(ctx, pool); err != nil {
		return 0, err
	}
	now := time.Now()
	for range c.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each COPY commits a slice of 100 000 rows at most, so a
			// failure late in the load keeps what was loaded (the load
			// resumes from the row count next time).
			for ctx.Err() == nil && next.Load() < int64(c.Rows) {
				fs := &finishedSource{c: c, next: &next, end: int64(c.Rows), payloads: payloads, now: now, chunk: 10_000}
				limited := &limitSource{src: fs, left: 100_000}
				n, err := copyStaged(ctx, pool, limited, c.Logs)
				copied.Add(n)
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				if n == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	progress.Stop()
	if firstErr != nil {
		return 0, fmt.Errorf("copying rows: %w", firstErr)
	}
	d := time.Since(start)
	logf("loaded %d rows in %s (%.0f rows/s)", copied.Load(), d.Round(time.Second), float64(copied.Load())/d.Seconds())
	return d, nil
}

// copyStaged copies src into the staging table and moves it to the outbox's
// tables, in one transaction.
func copyStaged(ctx context.Context, pool *pgxpool.Pool, src pgx.CopyFromSource, failedLogs bool) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, stagingTable); err != nil {
		return 0, err
	}
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"scale_staging"}, finishedColumns, src)
	if err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, loadStagedSQL, failedLogs); err != nil {
		return 0, err
	}
	return n, tx.Commit(ctx)
}

// limitSource ends a COPY after a number of rows, at a chunk boundary of
// the finishedSource so that no row is skipped.
type limitSource struct {
	src  *finishedSource
	left int
}

func (l *limitSource) Next() bool {
	if l.left <= 0 && l.src.i >= l.src.chunkEnd {
		return false
	}
	l.left--
	return l.src.Next()
}
func (l *limitSource) Values() ([]any, error) { return l.src.Values() }
func (l *limitSource) Err() error             { return l.src.Err() }

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func scaleMarkdown(c scaleConfig, rs []scaleResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s. Load average (1 min) %.2f. Claims of %d rows out of a backlog of %d PENDING rows; gauge refresh = outboxdb.ReadRecordGauges.\n\n",
		describeMachine(c.pgVersion), loadAvg(), c.ClaimBatch, c.Backlog)
	b.WriteString("| finished rows | partitions | state | table + indexes | dead row versions | claim p50 / p95 | claim scan buffers | record p50 | gauge refresh p50 / p95 | gauge buffers | SUCCESS gauge | outbox stats | show p50 | find --plate p50 |\n")
	b.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %d | %s / %s | %d | %s | %s / %s | %d | %s | %s | %s | %s |\n",
			r.Finished, r.Partitions, r.Label, mib(r.TableBytes), r.DeadTuples, ms(r.ClaimP50), ms(r.ClaimP95), r.ClaimScanBufs, ms(r.RecordP50),
			ms(r.GaugesP50), ms(r.GaugesP95), r.GaugesBuffers, r.GaugeSource, ms(r.StatsDuration), ms(r.ShowP50), ms(r.FindP50))
	}
	for _, r := range rs {
		if r.LoadDuration > 0 {
			fmt.Fprintf(&b, "\nCOPY of %d rows: %s (%.0f rows/s); VACUUM (ANALYZE) afterwards: %s.\n",
				c.Rows, r.LoadDuration.Round(time.Second), float64(c.Rows)/r.LoadDuration.Seconds(), r.VacuumDuration.Round(time.Second))
		}
		if len(r.Drain) > 0 {
			parts := make([]string, len(r.Drain))
			for i, d := range r.Drain {
				parts[i] = ms(d)
			}
			fmt.Fprintf(&b, "Drain of a %d-row backlog at %d finished rows, claims of 500: %.0f rows/s claimed and recorded; median claim by tenth of the drain: %s.\n",
				c.Drain, r.Finished, r.DrainPerSec, strings.Join(parts, ", "))
		}
		if r.ChurnPerSec > 0 {
			fmt.Fprintf(&b, "Churn before \"%s\": %.0f rows/s (insert 500, claim 500, record 500).\n", r.Label, r.ChurnPerSec)
		}
	}
	return b.String()
}
