package protection

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// poolOf opens a pool of size connections on a fresh outbox database, and
// returns it with a pool of its own for the test's statements.
func poolOf(t *testing.T, size int32) (pool, admin *pgxpool.Pool) {
	t.Helper()
	dsn, admin := pgtest.NewDBPool(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = size
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, admin
}

// TestGateReadsOnItsOwnConnection: the gate follows a pause another
// instance shared while every other connection of the stream's pool is
// taken (claims, renewals and result writes waiting on locks, a burst of
// replies each writing a result), because it keeps a connection for
// itself; a pool too small to spare one is shared instead of starved.
func TestGateReadsOnItsOwnConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FollowsWhileThePoolIsBusy", func(t *testing.T) {
		t.Parallel()
		pool, admin := poolOf(t, minPoolToKeepOne)
		g := NewGate(Config{SyncInterval: 50 * time.Millisecond, MaxInFlight: 10}, quietLog, Metrics{})
		if err := g.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		// The data path takes every connection the gate left (each may
		// take a while to open on a loaded machine: a 300 ms bound once
		// gave up on the second under the race detector), and then finds
		// none: the pool is full and the gate holds its own.
		for i := range minPoolToKeepOne - 1 {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := pool.Acquire(actx)
			cancel()
			if err != nil {
				t.Fatalf("the data path could take %d connections of a pool of %d, want all but the gate's one: %v", i, minPoolToKeepOne, err)
			}
			t.Cleanup(c.Release)
		}
		actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if c, err := pool.Acquire(actx); err == nil {
			c.Release()
			t.Errorf("the data path took all %d connections of the pool: the gate keeps none for itself", minPoolToKeepOne)
		}
		cancel()
		if _, err := outboxdb.PausePlatform(ctx, admin, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for blocked, _, _ := g.Blocked(); !blocked; blocked, _, _ = g.Blocked() {
			if time.Now().After(deadline) {
				t.Fatal("the gate did not follow a shared pause within 2s while the rest of the pool was busy")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("ASmallPoolIsShared", func(t *testing.T) {
		t.Parallel()
		const size = minPoolToKeepOne - 1
		pool, _ := poolOf(t, size)
		g := NewGate(Config{SyncInterval: 50 * time.Millisecond, MaxInFlight: 10}, quietLog, Metrics{})
		if err := g.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		time.Sleep(200 * time.Millisecond) // a few reads
		for range size {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := pool.Acquire(actx)
			cancel()
			if err != nil {
				t.Fatalf("a pool of %d: the data path cannot have every connection: %v", size, err)
			}
			defer c.Release()
		}
	})
}

// TestGateSharesABurstOfRetryAfterOnce: when every request in flight is
// answered 429 at once, the pause is written to the shared state once or
// twice, not once per reply (each write waits for the row the one before
// it locks, holding a connection), and the shared pause is the longest
// asked for.
func TestGateSharesABurstOfRetryAfterOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, admin := poolOf(t, 8)
	for _, stmt := range []string{
		`CREATE TABLE pause_writes (at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE FUNCTION count_pause_write() RETURNS trigger LANGUAGE plpgsql AS
		 $$ BEGIN INSERT INTO pause_writes DEFAULT VALUES; RETURN NEW; END $$`,
		`CREATE TRIGGER count_pause_write BEFORE UPDATE ON forward_platform_state
		 FOR EACH ROW EXECUTE FUNCTION count_pause_write()`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// No reads during the burst: only the pause writes the row.
	g := NewGate(Config{SyncInterval: time.Hour, MaxInFlight: 32}, quietLog, Metrics{})
	if err := g.Start(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)

	// The replies come at once: every goroutine waits for the start, so
	// that none is still being created when the first write has ended (under
	// the race detector on a loaded machine, 32 goroutines started one by
	// one came so far apart that every other one found the previous write
	// done and wrote again: that is a trickle, not a burst).
	const replies = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range replies {
		wg.Go(func() {
			<-start
			g.report(ctx, int64(i), Send, Reply{Unavailable: true, Overloaded: true, PauseFor: 5 * time.Second, Why: "http 429"})
		})
	}
	close(start)
	wg.Wait()
	var writes int
	var shared time.Time
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pause_writes), paused_until FROM forward_platform_state`).Scan(&writes, &shared); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	wanted := g.pauseWanted
	g.mu.Unlock()
	t.Logf("%d replies asking for a pause: %d writes; shared until %v, the longest asked for %v", replies, writes, shared.Format(time.StampMicro), wanted.Format(time.StampMicro))
	if writes == 0 || writes > replies/4 {
		t.Errorf("%d replies asking for a pause wrote the shared state %d times, want a few at most", replies, writes)
	}
	if shared.Before(wanted.Add(-250 * time.Millisecond)) {
		t.Errorf("the shared pause ends at %v, before the longest asked for (%v)", shared, wanted)
	}
}
