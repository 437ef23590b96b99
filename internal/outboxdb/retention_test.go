package outboxdb_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestTryPurgeWithSession: behind PgBouncer in transaction pooling mode the
// retention lock is held on the direct session and the retirements go
// through the pooler: a run skips while another session holds the lock,
// purges once it is free, and leaves no advisory lock behind on any server
// session (a session lock taken through the pooler would stay on whichever
// server connection ran it).
func TestTryPurgeWithSession(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, pool := pgtest.NewDBPool(t)
	db := fixture.New(t, pool)
	for i := range 30 {
		db.Insert(fixture.Row{Key: "old-" + strconv.Itoa(i), Status: "SUCCESS", Age: 48 * time.Hour})
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	b, err := pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Dir: t.TempDir() + "/bouncer", ServerPort: port, PoolSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	pooled, err := outboxdb.Open(ctx, b.DSN(strings.TrimPrefix(u.Path, "/")), outboxdb.PoolConfig{Pooled: true, MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer pooled.Close()
	session, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	opts := outboxdb.PurgeOptions{OlderThan: 24 * time.Hour}

	release := holdLock(t, dsn, "SELECT pg_advisory_xact_lock(x'666f727770757267'::bigint)")
	res, locked, err := outboxdb.TryPurgeWithSession(ctx, pooled, session, opts)
	if _, msgs, _ := res.Retired(); err != nil || locked || msgs != 0 {
		t.Fatalf("with the lock held elsewhere: locked %v, %d retired, %v; want a skipped run", locked, msgs, err)
	}
	release()
	// Other clients keep PgBouncer's server connections changing hands.
	stop := keepBusy(t, b.DSN(strings.TrimPrefix(u.Path, "/")), 2)
	res, locked, err = outboxdb.TryPurgeWithSession(ctx, pooled, session, opts)
	stop()
	if _, msgs, _ := res.Retired(); err != nil || !locked || msgs != 30 {
		t.Fatalf("locked %v, %d messages retired, %v; want the partition of the 30 old rows", locked, msgs, err)
	}
	var held int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d advisory locks left after the run (%v), want none", held, err)
	}
}

// TestRetentionLockOutlivesAnIdleSessionTimeout: the session that holds the
// retention lock is idle while the retirements run on the pool. With an
// idle_session_timeout an administrator set (here on that session alone)
// shorter than the purge, the server would end the session mid-purge and
// the lock with it, and another instance could purge beside it.
func TestRetentionLockOutlivesAnIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool := pgtest.NewDBPool(t)
	db := fixture.New(t, pool)
	db.Insert(fixture.Row{Key: "old", Status: "SUCCESS", Age: 48 * time.Hour})
	session, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	session.RuntimeParams["idle_session_timeout"] = "200ms"
	// A reader keeps the partition from being dropped: the purge waits for
	// it 300ms at a time, five times.
	release := holdLock(t, dsn, "SELECT count(*) FROM forward_messages")
	opts := outboxdb.PurgeOptions{OlderThan: 24 * time.Hour, LockTimeout: 300 * time.Millisecond, LockTries: 5}
	type result struct {
		locked bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		_, locked, err := outboxdb.TryPurgeWithSession(ctx, pool, session, opts)
		done <- result{locked, err}
	}()
	time.Sleep(time.Second)
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	var took bool
	if err := other.QueryRow(ctx, "SELECT pg_try_advisory_lock(x'666f727770757267'::bigint)").Scan(&took); err != nil {
		t.Fatal(err)
	}
	release()
	r := <-done
	if took {
		t.Errorf("another session took the retention lock during the purge: the session holding it was ended while idle")
	}
	if r.err != nil || !r.locked {
		t.Errorf("TryPurgeWithSession: locked %v, %v; want a run that held the lock", r.locked, r.err)
	}
}
