package outboxdb_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestCheckSession: a connection to PostgreSQL itself keeps its session
// between transactions; one through PgBouncer in transaction pooling mode
// does not, and is recognised, whatever the size of PgBouncer's pool and
// while other clients keep its server connections busy; in session pooling
// mode it does.
func TestCheckSession(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.NewDB(t)
	cfg := func(dsn string) *pgx.ConnConfig {
		c, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if err := outboxdb.CheckSession(ctx, cfg(dsn)); err != nil {
		t.Fatalf("PostgreSQL itself: %v", err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	db := strings.TrimPrefix(u.Path, "/")
	for _, c := range []struct {
		mode   string
		size   int
		busy   bool
		pooled bool
	}{
		{"transaction", 10, false, true}, {"transaction", 1, false, true}, {"transaction", 4, true, true},
		{"session", 10, false, false}, {"session", 10, true, false},
	} {
		b, err := pgcluster.StartBouncer(ctx, pgcluster.BouncerConfig{Dir: t.TempDir() + "/bouncer", ServerPort: port, PoolMode: c.mode, PoolSize: c.size})
		if err != nil {
			t.Fatal(err)
		}
		stop := func() {}
		if c.busy {
			stop = keepBusy(t, b.DSN(db), 3)
		}
		for range 3 {
			err = outboxdb.CheckSession(ctx, cfg(b.DSN(db)))
			if got := errors.Is(err, outboxdb.ErrTransactionPooler); got != c.pooled || (err != nil && !got) {
				t.Errorf("PgBouncer, pool_mode %s, pool size %d, busy %v: %v; want pooled %v", c.mode, c.size, c.busy, err, c.pooled)
			}
		}
		stop()
		b.Stop()
	}
}

// keepBusy runs short transactions on n connections to dsn until stopped.
func keepBusy(t *testing.T, dsn string, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		conn, err := pgx.Connect(context.Background(), dsn+"&default_query_exec_mode=simple_protocol")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				_, _ = conn.Exec(ctx, "SELECT pg_sleep(0.002)")
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}
