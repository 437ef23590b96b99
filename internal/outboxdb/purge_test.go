package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

const day = 24 * time.Hour // the default partition width

// purgeBundle is a database with rows on several past days, each day in
// its own partition.
type purgeBundle struct {
	pool *pgxpool.Pool
	db   *fixture.DB
	ctx  context.Context
	// days maps a name to the label of its partition.
	days map[string]string
}

// setupPurge makes, with a retention of a week in mind:
//
//	finished    10 days ago: SUCCESS rows only (with attempt logs)
//	failed      12 days ago: SUCCESS and a FAILED row not published
//	published   13 days ago: SUCCESS and a FAILED row published to the dead-letter topic
//	pending      9 days ago: SUCCESS and a PENDING row
//	inProgress   8 days ago: SUCCESS and an IN_PROGRESS row
//	blocked     11 days ago: SUCCESS and a FAILED row blocking its ordering key
//	recent       2 days ago: SUCCESS rows only, newer than the retention
func setupPurge(t *testing.T) *purgeBundle {
	t.Helper()
	pool := pgtest.NewPool(t)
	b := &purgeBundle{pool: pool, db: fixture.New(t, pool), ctx: context.Background(), days: map[string]string{}}
	add := func(name string, age time.Duration, rows ...fixture.Row) {
		for i := range 3 {
			rows = append(rows, fixture.Row{Key: fmt.Sprintf("%s-done-%d", name, i), Status: "SUCCESS", Attempts: 2})
		}
		for i := range rows {
			rows[i].Age = age
		}
		ids := b.db.Insert(rows...)
		for _, id := range ids {
			// An earlier attempt of each, beside the SUCCESS one the
			// fixture writes for delivered rows.
			b.db.Exec(`INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, attempted_at)
				SELECT id, created_at, 1, 'PENDING', created_at FROM forward_messages WHERE id = $1`, id)
		}
		var lower, upper time.Time
		if err := pool.QueryRow(b.ctx, `SELECT p.lower, p.upper FROM forward_partitions p
			WHERE p.lower <= now() - $1::bigint * interval '1 millisecond' AND p.upper > now() - $1::bigint * interval '1 millisecond'`,
			age.Milliseconds()).Scan(&lower, &upper); err != nil {
			t.Fatal(err)
		}
		b.days[name] = outboxdb.PartitionOutcome{Lower: lower, Upper: upper}.Label()
	}
	add("finished", 10*day)
	add("failed", 12*day, fixture.Row{Key: "failed-x", Status: "FAILED", FailureClass: "REJECTED", LastError: "errcode 998"})
	add("published", 13*day, fixture.Row{Key: "published-x", Status: "FAILED", FailureClass: "REJECTED"})
	b.db.Exec(`UPDATE forward_deliveries SET dead_lettered_at = now() WHERE message_key = 'published-x'`)
	add("pending", 9*day, fixture.Row{Key: "pending-x", Status: "PENDING", Attempts: 1})
	add("inProgress", 8*day, fixture.Row{Key: "in-progress-x", Status: "IN_PROGRESS", Attempts: 1})
	add("blocked", 11*day, fixture.Row{Key: "blocked-x", Status: "FAILED", OrderingKey: "P1/B1", OrderBlocked: true})
	add("recent", 2*day)
	return b
}

// keys counts the messages whose key starts with prefix.
func (b *purgeBundle) keys(t *testing.T, prefix string) int {
	t.Helper()
	return b.db.Count("message_key LIKE $1", prefix+"%")
}

// outcomes maps the partitions of res by name (setupPurge's days).
func (b *purgeBundle) outcomes(t *testing.T, res outboxdb.PurgeResult) map[string]outboxdb.PartitionOutcome {
	t.Helper()
	byLabel := map[string]outboxdb.PartitionOutcome{}
	for _, o := range res.Partitions {
		byLabel[o.Label()] = o
	}
	out := map[string]outboxdb.PartitionOutcome{}
	for name, label := range b.days {
		if o, ok := byLabel[label]; ok {
			out[name] = o
			delete(byLabel, label)
		}
	}
	for label, o := range byLabel {
		// The migration's and the fixture's empty partitions of the
		// days in between.
		if o.Messages != 0 || o.Outcome == outboxdb.PartitionKept {
			t.Errorf("partition %s: %+v, want an empty one, not kept", label, o)
		}
	}
	return out
}

func (b *purgeBundle) partitionExists(t *testing.T, label string) bool {
	t.Helper()
	ps, err := outboxdb.ListPartitions(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Label() == label {
			var tables int
			if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM pg_class WHERE relname IN ($1, $2)", p.Messages, p.RetryLogs).Scan(&tables); err != nil {
				t.Fatal(err)
			}
			if tables != 2 {
				t.Errorf("partition %s is registered but has %d of its 2 tables", label, tables)
			}
			return true
		}
	}
	return false
}

func TestPurge(t *testing.T) {
	t.Parallel()
	week := 7 * day

	t.Run("RetiresFinishedPartitionsAndKeepsUnfinishedOnes", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		var progress []string
		res, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week, Operator: "alice",
			Progress: func(o outboxdb.PartitionOutcome) { progress = append(progress, o.Label()) }})
		if err != nil {
			t.Fatal(err)
		}
		got := b.outcomes(t, res)
		want := map[string]struct {
			outcome     string
			messages    int64
			failed      int64
			why         string
			keysLeft    int
			tablesExist bool
		}{
			"finished":   {outboxdb.PartitionRetired, 3, 0, "", 0, false},
			"failed":     {outboxdb.PartitionRetired, 4, 1, "", 0, false},
			"published":  {outboxdb.PartitionRetired, 4, 1, "", 0, false},
			"pending":    {outboxdb.PartitionKept, 0, 0, "1 PENDING row", 4, true},
			"inProgress": {outboxdb.PartitionKept, 0, 0, "1 IN_PROGRESS row", 4, true},
			"blocked":    {outboxdb.PartitionKept, 0, 1, "1 FAILED row blocking its ordering key", 4, true},
		}
		for name, w := range want {
			o, ok := got[name]
			if !ok {
				t.Errorf("%s: no outcome", name)
				continue
			}
			if o.Outcome != w.outcome || o.Why() != w.why || (w.outcome == outboxdb.PartitionRetired && (o.Messages != w.messages || o.Failed != w.failed)) {
				t.Errorf("%s: %s, %d messages, %d FAILED, why %q; want %s, %d, %d, %q", name, o.Outcome, o.Messages, o.Failed, o.Why(),
					w.outcome, w.messages, w.failed, w.why)
			}
			prefix := map[string]string{"finished": "finished-", "failed": "failed-", "published": "published-",
				"pending": "pending-", "inProgress": "inProgress-", "blocked": "blocked-"}[name]
			if name == "inProgress" {
				prefix = ""
			}
			if prefix != "" {
				if n := b.keys(t, prefix); n != w.keysLeft {
					t.Errorf("%s: %d messages left, want %d", name, n, w.keysLeft)
				}
			}
			if b.partitionExists(t, b.days[name]) != w.tablesExist {
				t.Errorf("%s: partition present %v, want %v", name, !w.tablesExist, w.tablesExist)
			}
		}
		if _, ok := got["recent"]; ok || b.keys(t, "recent-") != 3 {
			t.Errorf("the partition newer than the retention was considered or touched (%d rows left)", b.keys(t, "recent-"))
		}
		if len(progress) != len(res.Partitions) {
			t.Errorf("progress called for %v, want every partition of %d", progress, len(res.Partitions))
		}
		// Nothing of the retired days is left: no delivery row of a FAILED
		// message, no attempt log.
		var orphans int
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM forward_deliveries d
				WHERE NOT EXISTS (SELECT 1 FROM forward_messages m WHERE m.id = d.id AND m.created_at = d.created_at))
			+ (SELECT count(*) FROM forward_retry_logs l
				WHERE NOT EXISTS (SELECT 1 FROM forward_messages m WHERE m.id = l.record_id AND m.created_at = l.record_created_at))`).Scan(&orphans); err != nil || orphans != 0 {
			t.Errorf("%d delivery rows or attempt logs without their message (%v)", orphans, err)
		}

		// Each retired partition that held messages is in the operator log.
		log, err := outboxdb.RecentOperatorActions(b.ctx, b.pool, 100)
		if err != nil {
			t.Fatal(err)
		}
		logged := map[int64]int{}
		for _, a := range log {
			if a.Operator != "alice" || a.Action != outboxdb.ActionPurge || !strings.Contains(a.Filter, "retired (older than 7d)") {
				t.Errorf("operator log %+v, want alice's purge of a partition older than 7d", a)
			}
			if strings.Contains(a.Filter, "with its 1 FAILED rows") {
				logged[a.Rows+1000]++
			} else {
				logged[a.Rows]++
			}
		}
		if logged[3] != 1 || logged[1004] != 2 {
			t.Errorf("operator log %+v, want the 3 messages of one day and the 4 (1 FAILED) of two", log)
		}

		// Nothing more to do, whatever the number of runs.
		res, err = outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week})
		if parts, _, _ := res.Retired(); err != nil || parts != 0 || len(res.Kept()) != 3 {
			t.Errorf("second run: %d retired, %d kept, %v; want 0 and the 3 unfinished days", parts, len(res.Kept()), err)
		}
	})

	t.Run("KeysOfARetiredDayAreForgottenThoseOfAKeptDayAreNot", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		if _, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week}); err != nil {
			t.Fatal(err)
		}
		recs := []outboxdb.NewRecord{}
		for _, k := range []string{"finished-done-0", "failed-x", "pending-done-0", "blocked-x", "recent-done-0"} {
			recs = append(recs, outboxdb.NewRecord{MessageKey: k, APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t",
				Payload: []byte(`{}`), Status: outboxdb.StatusPending})
		}
		for i, want := range []bool{true, true, false, false, false} {
			c, err := outboxdb.InsertBatchCount(b.ctx, b.pool, recs[i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			if inserted := c.Pending == 1; inserted != want {
				t.Errorf("redelivery of %s: inserted %v, want %v (retired days forget their keys, kept days do not)",
					recs[i].MessageKey, inserted, want)
			}
		}
	})

	t.Run("DeadLetterKeepsUnpublishedFailures", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		res, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week, DeadLetter: true})
		if err != nil {
			t.Fatal(err)
		}
		got := b.outcomes(t, res)
		if o := got["failed"]; o.Outcome != outboxdb.PartitionKept || o.Why() != "1 FAILED row not yet published to the dead-letter topic" {
			t.Errorf("day with an unpublished FAILED row: %s (%s), want kept", o.Outcome, o.Why())
		}
		if o := got["published"]; o.Outcome != outboxdb.PartitionRetired || o.Failed != 1 {
			t.Errorf("day whose FAILED row was published: %+v, want retired with it", o)
		}
		if b.keys(t, "failed-") != 4 || b.keys(t, "published-") != 0 {
			t.Errorf("%d failed- and %d published- rows left, want 4 and 0", b.keys(t, "failed-"), b.keys(t, "published-"))
		}
		// Once published, it goes.
		b.db.Exec(`UPDATE forward_deliveries SET dead_lettered_at = now() WHERE message_key = 'failed-x'`)
		res, err = outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week, DeadLetter: true})
		if o := b.outcomes(t, res)["failed"]; err != nil || o.Outcome != outboxdb.PartitionRetired {
			t.Errorf("after publishing: %+v, %v; want retired", o, err)
		}
	})

	t.Run("DryRunChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		res, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		got := b.outcomes(t, res)
		for name, want := range map[string]int64{"finished": 3, "failed": 4, "pending": 4, "blocked": 4} {
			if got[name].Messages != want {
				t.Errorf("dry run, %s: %d messages counted, want %d", name, got[name].Messages, want)
			}
		}
		if got["finished"].Outcome != outboxdb.PartitionRetired || got["pending"].Outcome != outboxdb.PartitionKept {
			t.Errorf("dry run outcomes %+v", got)
		}
		for name := range b.days {
			if !b.partitionExists(t, b.days[name]) {
				t.Errorf("dry run dropped %s", name)
			}
		}
		if log, err := outboxdb.RecentOperatorActions(b.ctx, b.pool, 10); err != nil || len(log) != 0 {
			t.Errorf("dry run logged %+v (%v)", log, err)
		}
	})

	t.Run("TheFunctionChecksAgainUnderItsLock", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		// What the plan saw has changed by the time of the drop: the
		// FAILED row of a day was requeued. The function refuses.
		plan, err := outboxdb.PlanPurge(b.ctx, b.pool, time.Now().Add(-week), false, false)
		if err != nil {
			t.Fatal(err)
		}
		var lower time.Time
		for _, o := range plan {
			if o.Label() == b.days["failed"] {
				if o.Outcome != outboxdb.PartitionRetired {
					t.Fatalf("plan for the failed day: %+v", o)
				}
				lower = o.Lower
			}
		}
		b.db.Exec(`UPDATE forward_deliveries SET status = 'PENDING', next_retry_at = now() WHERE message_key = 'failed-x'`)
		var outcome string
		var pending int64
		if err := b.pool.QueryRow(b.ctx, `SELECT outcome, pending_count FROM forward_partition_retire($1, now() - interval '7 days', false, 'test', 'x', 100, 1)`,
			lower).Scan(&outcome, &pending); err != nil || outcome != outboxdb.PartitionKept || pending != 1 {
			t.Fatalf("retire after a requeue: %s, %d pending, %v; want KEPT", outcome, pending, err)
		}
		if !b.partitionExists(t, b.days["failed"]) || b.keys(t, "failed-") != 4 {
			t.Error("the requeued day was dropped")
		}
		// Partitions newer than the cutoff, and cutoffs in the future, are
		// refused.
		for _, q := range []string{
			`SELECT outcome FROM forward_partition_retire($1, now() - interval '12 days', false, 'test', 'x', 100, 1)`,
			`SELECT outcome FROM forward_partition_retire($1, now() + interval '1 day', false, 'test', 'x', 100, 1)`,
		} {
			if err := b.pool.QueryRow(b.ctx, q, lower).Scan(&outcome); err == nil {
				t.Errorf("%s: %s, want an error", q, outcome)
			}
		}
	})

	t.Run("WaitsBoundedlyForItsLock", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		dsn := b.pool.Config().ConnString()
		// A long transaction reading the messages: the drop cannot get its
		// lock, and gives up after its tries without keeping others
		// waiting longer than one lock_timeout at a time.
		release := holdLock(t, dsn, "SELECT count(*) FROM forward_messages")
		start := time.Now()
		res, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week, LockTimeout: 20 * time.Millisecond, LockTries: 3})
		if err != nil {
			t.Fatal(err)
		}
		// The oldest partition waits its tries; the others are left for
		// the next run instead of waiting as long again.
		if first := res.Partitions[0]; first.Outcome != outboxdb.PartitionBusy || first.LockWaits != 3 ||
			!strings.Contains(first.Why(), "could not be locked in 3 waits") {
			t.Errorf("with the tables held: %+v (%s), want BUSY after 3 waits", first, first.Why())
		}
		for _, o := range res.Partitions[1:] {
			if o.Outcome == outboxdb.PartitionRetired || (o.Outcome == outboxdb.PartitionBusy && o.LockWaits != 0) {
				t.Errorf("partition %s after a busy one: %+v (%s), want it left for the next run", o.Label(), o, o.Why())
			}
		}
		if !b.partitionExists(t, b.days["finished"]) {
			t.Error("partition dropped while held")
		}
		t.Logf("a run against held tables took %s", time.Since(start))
		release()
		res, err = outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week})
		if o := b.outcomes(t, res)["finished"]; err != nil || o.Outcome != outboxdb.PartitionRetired {
			t.Errorf("once released: %+v, %v; want retired", o, err)
		}
	})

	t.Run("SafeWhileRowsAreWrittenAndClaimed", func(t *testing.T) {
		t.Parallel()
		b := setupPurge(t)
		ctx, cancel := context.WithCancel(b.ctx)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			inserted int
			errs     []error
		)
		// The service meanwhile: inserts and claims of today's rows.
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					_, err := outboxdb.InsertBatchCount(ctx, b.pool, []outboxdb.NewRecord{{MessageKey: fmt.Sprintf("live-%d-%d", w, i),
						APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending}})
					if err == nil {
						_, err = outboxdb.ClaimDue(ctx, b.pool, outboxdb.ClaimParams{Limit: 5, Lease: time.Minute, Claimer: "live"})
					}
					mu.Lock()
					if err != nil && ctx.Err() == nil {
						errs = append(errs, err)
					}
					if err == nil {
						inserted++
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(100 * time.Millisecond)
		res, err := outboxdb.Purge(b.ctx, b.pool, outboxdb.PurgeOptions{OlderThan: week})
		time.Sleep(100 * time.Millisecond)
		cancel()
		wg.Wait()
		if err != nil || len(errs) > 0 {
			t.Fatalf("purge: %v; service: %v", err, errs)
		}
		if parts, _, _ := res.Retired(); parts < 3 {
			t.Errorf("%d partitions retired under load, want at least the 3 finished days (%+v)", parts, res.Partitions)
		}
		if n := b.keys(t, "live-"); n < inserted {
			t.Errorf("%d of %d live rows left", n, inserted)
		}
	})
}

// TestRetireWritesLittleWAL retires a day of 100 000 delivered messages
// (and 100 FAILED ones), each with an attempt log, on a private cluster
// with production durability (full_page_writes on) right after a
// checkpoint, so that every page the retirement touches is logged whole:
// the worst case. Dropping the partition writes the catalog changes, not
// the rows; deleting them row by row would log each one.
func TestRetireWritesLittleWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startQuietCluster(t)
	dsn := pgtest.NewDBOn(t, c)
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := fixture.New(t, pool)
	db.EnsurePartitions(10 * day)
	const n, failed = 100_000, 100
	db.Exec(`WITH m AS (
		INSERT INTO forward_messages (created_at, message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload,
		                              plate_no, park_code, berth_code, device_id)
		SELECT now() - interval '10 days' + g * interval '1 millisecond', 'wal-' || g, 'VEHICLE_EVENT', 'device-vehicle-event',
		       g % 3, g, convert_to(repeat('x', 480) || g, 'UTF8'),
		       'P' || (g % 5000), 'K' || (g % 100), 'B' || (g % 5000), 'CAM-' || (g % 2000)
		FROM generate_series(1, $1::integer) g
		RETURNING id, created_at, message_key
	), l AS (
		INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status, attempted_at)
		SELECT id, created_at, 1, 'SUCCESS', 200, created_at
		FROM m
	)
	-- The first ones ended FAILED instead.
	INSERT INTO forward_deliveries (id, created_at, message_key, status, payload_size, failure_class, failed_at, last_error)
	SELECT id, created_at, message_key, 'FAILED', 490, 'REJECTED', created_at, 'errcode 998'
	FROM m
	ORDER BY id
	LIMIT $2`, n, failed)
	db.Exec(`VACUUM (ANALYZE) forward_messages`)
	db.Exec(`VACUUM (ANALYZE) forward_retry_logs`)
	db.Exec(`CHECKPOINT`)

	var before string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := outboxdb.Purge(ctx, pool, outboxdb.PurgeOptions{OlderThan: 7 * day})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var wal int64
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", before).Scan(&wal); err != nil {
		t.Fatal(err)
	}
	_, msgs, fails := res.Retired()
	if msgs != n || fails != failed {
		t.Fatalf("retired %d messages and %d FAILED rows (%+v), want %d and %d", msgs, fails, res.Partitions, n, failed)
	}
	if left := db.Count("message_key LIKE 'wal-%'"); left != 0 {
		t.Fatalf("%d messages left", left)
	}
	t.Logf("retiring a partition of %d messages wrote %d bytes of WAL in %s", n, wal, took)
	const limit = 1 << 20
	if wal >= limit {
		t.Errorf("retiring a partition of %d messages wrote %d bytes of WAL, want under %d", n, wal, limit)
	}
}

// startQuietCluster starts a private server with production durability and
// no autovacuum, so that the WAL it writes is the test's own.
func startQuietCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: t.TempDir() + "/data", Durable: true,
		Settings: map[string]string{"autovacuum": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Remove() })
	return c
}
