package outboxdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// liveTestMigration is a migration of the kind a live upgrade makes, in every
// step mode: a column added (a strong lock, held for an instant), filled in
// batches, indexed concurrently, then a constraint added NOT VALID and
// validated without blocking writes.
const liveTestMigration = `-- migration: online
ALTER TABLE forward_deliveries ADD COLUMN payload_bytes integer;
ALTER TABLE forward_deliveries ALTER COLUMN payload_bytes SET DEFAULT 0;

-- step: batch
UPDATE forward_deliveries SET payload_bytes = payload_size
WHERE id IN (SELECT id FROM forward_deliveries WHERE payload_bytes IS NULL LIMIT 200 FOR UPDATE SKIP LOCKED);

-- step: concurrent
CREATE INDEX CONCURRENTLY forward_deliveries_payload_bytes_idx ON forward_deliveries (payload_bytes);

-- step: transaction
ALTER TABLE forward_deliveries ADD CONSTRAINT forward_deliveries_payload_bytes_check CHECK (payload_bytes >= 0) NOT VALID;

-- step: transaction
ALTER TABLE forward_deliveries VALIDATE CONSTRAINT forward_deliveries_payload_bytes_check;
`

// TestMigrateUnderLoad applies a migration while writers insert, claim and
// record results as the service does, and while a long transaction holds
// forward_deliveries (a report, a slow lookup) when the migration starts
// (docs/deployment.md, "Schema changes while the service runs"). Every
// writer runs with its own lock_timeout of the migration's lock timeout plus
// a second: a write that waits longer for a lock fails, and the test with
// it. So no write waits longer than the lock timeout (plus the instant a
// step holds its lock), nothing written is lost, and the migration is
// complete. The second half shows that the bound is not idle: without the
// migration's lock timeout the same writers queue behind its ALTER TABLE
// for as long as the long transaction lasts, and fail.
func TestMigrateUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		lockTimeout = 500 * time.Millisecond
		writerBound = lockTimeout + time.Second
		blockerHold = 6 * time.Second
	)

	t.Run("WithTheLockTimeoutNoWriteWaitsLongerAndNothingIsLost", func(t *testing.T) {
		t.Parallel()
		l := startLiveLoad(t, writerBound)
		var mu sync.Mutex
		var progress []string
		res, err := l.migrate(blockerHold, outboxdb.MigrateOptions{LockTimeout: lockTimeout, LockWait: time.Minute,
			Progress: func(line string) { mu.Lock(); progress = append(progress, line); mu.Unlock() }})
		// Traffic after the migration too: new rows take the new default.
		time.Sleep(500 * time.Millisecond)
		l.stop()
		if err != nil {
			t.Fatalf("migration: %v", err)
		}
		mu.Lock()
		t.Logf("migration %v under load:\n  %s", res.Applied, strings.Join(progress, "\n  "))
		retried := strings.Contains(strings.Join(progress, "\n"), "trying again")
		mu.Unlock()
		if !retried {
			t.Errorf("the migration never met the long transaction's lock: the test did not test the lock timeout")
		}
		if errs := l.errors(); len(errs) > 0 {
			t.Fatalf("%d writes failed during the migration (a write waited more than %s for a lock?), first: %v", len(errs), writerBound, errs[0])
		}
		l.drainAndVerify()
		var nulls int
		var valid, validated bool
		if err := l.pool.QueryRow(l.ctx, `SELECT (SELECT count(*) FROM forward_deliveries WHERE payload_bytes IS NULL),
				(SELECT indisvalid FROM pg_index WHERE indexrelid = 'forward_deliveries_payload_bytes_idx'::regclass),
				(SELECT convalidated FROM pg_constraint WHERE conname = 'forward_deliveries_payload_bytes_check')`).Scan(&nulls, &valid, &validated); err != nil {
			t.Fatal(err)
		}
		if nulls != 0 || !valid || !validated {
			t.Errorf("migration incomplete: %d rows without payload_bytes, index valid %v, constraint validated %v", nulls, valid, validated)
		}
		t.Logf("%d rows written by %d writers, longest write %s (bound %s)", l.inserted.Load(), liveWriters, l.longest().Round(time.Millisecond), writerBound)
	})

	t.Run("WithoutItWritersQueueBehindTheMigration", func(t *testing.T) {
		t.Parallel()
		l := startLiveLoad(t, writerBound)
		_, err := l.migrate(blockerHold, outboxdb.MigrateOptions{NoLockTimeout: true})
		time.Sleep(200 * time.Millisecond)
		l.stop()
		if err != nil {
			t.Fatalf("migration: %v", err)
		}
		var lockWaits int
		for _, err := range l.errors() {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				lockWaits++
			}
		}
		if lockWaits == 0 {
			t.Fatalf("no write waited more than %s behind a migration without lock timeout and a %s transaction in its way (longest %s): the load does not show what the lock timeout prevents",
				writerBound, blockerHold, l.longest().Round(time.Millisecond))
		}
		t.Logf("without a lock timeout, %d writes waited more than %s (longest %s)", lockWaits, writerBound, l.longest().Round(time.Millisecond))
	})
}

const liveWriters = 3

// liveLoad writes to one database as the service does, from several
// goroutines, until stopped.
type liveLoad struct {
	t    *testing.T
	ctx  context.Context
	dsn  string
	pool *pgxpool.Pool

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	inserted atomic.Int64

	mu      sync.Mutex
	errs    []error
	keys    []string
	maxWait time.Duration
}

// startLiveLoad starts the writers on a fresh migrated database: two insert
// batches of 20 PENDING rows in turn, one claims and records results.
// Their connections have lock_timeout = bound.
func startLiveLoad(t *testing.T, bound time.Duration) *liveLoad {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	// stopped ends the loops; each write runs to its end with ctx, so that
	// every write the database committed is counted.
	stopped, cancel := context.WithCancel(context.Background())
	ctx := context.Background()
	l := &liveLoad{t: t, ctx: ctx, dsn: dsn, pool: pool, cancel: cancel}
	t.Cleanup(l.stop)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = liveWriters
	pcfg.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprint(bound.Milliseconds())
	writers, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(writers.Close)
	timed := func(fn func() error) {
		start := time.Now()
		err := fn()
		took := time.Since(start)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.maxWait = max(l.maxWait, took)
		if err != nil {
			l.errs = append(l.errs, err)
		}
	}
	for w := range 2 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; stopped.Err() == nil; n++ {
				recs := make([]outboxdb.NewRecord, 20)
				keys := make([]string, len(recs))
				for i := range recs {
					keys[i] = fmt.Sprintf("live-%d-%d-%d", w, n, i)
					recs[i] = outboxdb.NewRecord{MessageKey: keys[i], APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t",
						KafkaOffset: int64(n*20 + i), Payload: []byte(`{"n":` + fmt.Sprint(n) + `}`), Status: outboxdb.StatusPending}
				}
				timed(func() error {
					_, err := outboxdb.InsertBatchCount(ctx, writers, recs)
					if err == nil {
						l.inserted.Add(int64(len(recs)))
						l.mu.Lock()
						l.keys = append(l.keys, keys...)
						l.mu.Unlock()
					}
					return err
				})
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for stopped.Err() == nil {
			timed(func() error { _, err := claimAndRecord(ctx, writers, 50); return err })
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return l
}

// claimAndRecord claims up to limit due rows and records them SUCCESS.
func claimAndRecord(ctx context.Context, pool *pgxpool.Pool, limit int) (int, error) {
	res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: limit, Lease: time.Minute, Claimer: "live", MaxAttempts: 5})
	if err != nil || len(res.Claimed) == 0 {
		return 0, err
	}
	results := make([]outboxdb.Result, len(res.Claimed))
	for i, r := range res.Claimed {
		results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
	}
	_, err = outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{})
	return len(results), err
}

// migrate lets the writers run for a moment, opens a transaction that reads
// forward_deliveries and holds its lock for hold, and applies
// liveTestMigration meanwhile.
func (l *liveLoad) migrate(hold time.Duration, opts outboxdb.MigrateOptions) (outboxdb.MigrateResult, error) {
	l.t.Helper()
	time.Sleep(500 * time.Millisecond)
	release := holdLock(l.t, l.dsn, "SELECT count(*) FROM forward_deliveries")
	timer := time.AfterFunc(hold, release)
	defer timer.Stop()
	m, err := outboxdb.ParseMigration("0100_live.sql", liveTestMigration)
	if err != nil {
		l.t.Fatal(err)
	}
	opts.Migrations = append(mustMigrations(l.t), m)
	return migrateSession(l.ctx, l.dsn, opts)
}

func (l *liveLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *liveLoad) errors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *liveLoad) longest() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxWait
}

// drainAndVerify delivers what is left and checks that every row written is
// there, once, and SUCCESS.
func (l *liveLoad) drainAndVerify() {
	l.t.Helper()
	for {
		n, err := claimAndRecord(l.ctx, l.pool, 1000)
		if err != nil {
			l.t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	l.mu.Lock()
	keys := slices.Clone(l.keys)
	l.mu.Unlock()
	var found, success int
	if err := l.pool.QueryRow(l.ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS')
		FROM forward_records WHERE message_key = ANY($1)`, keys).Scan(&found, &success); err != nil {
		l.t.Fatal(err)
	}
	var total int
	if err := l.pool.QueryRow(l.ctx, "SELECT count(*) FROM forward_records").Scan(&total); err != nil {
		l.t.Fatal(err)
	}
	if len(keys) == 0 || found != len(keys) || success != len(keys) || total != len(keys) {
		l.t.Fatalf("%d rows written, %d found (%d SUCCESS), %d in the table: want every one, once, SUCCESS", len(keys), found, success, total)
	}
}
