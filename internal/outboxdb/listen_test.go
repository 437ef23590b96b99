package outboxdb_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

var listenerSeq atomic.Int64

type listenTestBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	appName  string
	listener *outboxdb.Listener
	listens  chan struct{}
	errs     atomic.Int64
	stopped  chan struct{}
}

// setupListenTest runs a Listener on a fresh database until the test ends.
func setupListenTest(t *testing.T) *listenTestBundle {
	t.Helper()
	return setupListenTestOn(t, pgtest.NewPool(t))
}

// setupListenTestOn runs a Listener on pool's database until the test ends.
func setupListenTestOn(t *testing.T, pool *pgxpool.Pool) *listenTestBundle {
	t.Helper()
	b := &listenTestBundle{
		ctx:     context.Background(),
		pool:    pool,
		appName: fmt.Sprintf("listen-test-%d", listenerSeq.Add(1)),
		listens: make(chan struct{}, 16),
		stopped: make(chan struct{}),
	}
	cc := b.pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["application_name"] = b.appName
	b.listener = outboxdb.NewListener(outboxdb.ListenerConfig{
		ConnConfig: cc,
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		OnListen:   func() { b.listens <- struct{}{} },
		OnError:    func(error) { b.errs.Add(1) },
	})
	ctx, cancel := context.WithCancel(b.ctx)
	go func() {
		defer close(b.stopped)
		b.listener.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-b.stopped
	})
	return b
}

func (b *listenTestBundle) waitListening(t *testing.T) {
	t.Helper()
	select {
	case <-b.listens:
	case <-time.After(30 * time.Second):
		t.Fatal("listener never listened")
	}
	// The first LISTEN also wakes: drop it so the next wake is a notification.
	select {
	case <-b.listener.Wake():
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up after LISTEN")
	}
}

func (b *listenTestBundle) notify(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, "SELECT pg_notify($1, 'test')", outboxdb.NotifyChannel); err != nil {
		t.Fatal(err)
	}
}

func (b *listenTestBundle) waitWake(t *testing.T) {
	t.Helper()
	select {
	case <-b.listener.Wake():
	case <-time.After(30 * time.Second):
		t.Fatal("notification did not wake the listener")
	}
}

func TestListener(t *testing.T) {
	t.Parallel()

	t.Run("NotificationWakes", func(t *testing.T) {
		t.Parallel()
		b := setupListenTest(t)
		b.waitListening(t)
		b.notify(t)
		b.waitWake(t)
		// Several notifications before a receive make at least one wake-up.
		for range 5 {
			b.notify(t)
		}
		b.waitWake(t)
	})

	t.Run("ListensAgainAfterLostConnection", func(t *testing.T) {
		t.Parallel()
		b := setupListenTest(t)
		b.waitListening(t)

		var killed bool
		if err := b.pool.QueryRow(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = $1`, b.appName).Scan(&killed); err != nil || !killed {
			t.Fatalf("terminating the listener's backend: %v (killed %v)", err, killed)
		}
		select {
		case <-b.listens:
		case <-time.After(30 * time.Second):
			t.Fatal("listener did not listen again after losing its connection")
		}
		if b.errs.Load() == 0 {
			t.Error("the lost connection was not reported")
		}
		b.waitWake(t) // the wake-up after re-LISTEN: work may have been missed
		b.notify(t)
		b.waitWake(t)
	})

	// A server that ends sessions idle for 1 s (idle_session_timeout, set
	// for the database) ended the listening one between its pings, every
	// second: it now pings within half that, and keeps its one LISTEN.
	t.Run("OutlivesTheServersIdleSessionTimeout", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		pgtest.SetForDatabase(t, pool, "idle_session_timeout", "1s")
		b := setupListenTestOn(t, pool)
		b.waitListening(t)
		time.Sleep(3500 * time.Millisecond)
		select {
		case <-b.listens:
			t.Fatalf("the listener listened again: the server ended its idle session (%d errors)", b.errs.Load())
		default:
		}
		if n := b.errs.Load(); n != 0 {
			t.Fatalf("%d connection failures, want none", n)
		}
		b.notify(t)
		b.waitWake(t)
	})

	t.Run("RunReturnsOnCancel", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		l := outboxdb.NewListener(outboxdb.ListenerConfig{ConnConfig: pool.Config().ConnConfig})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Run(ctx)
		}()
		<-l.Wake() // listening
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	})

	t.Run("RetriesWhileServerUnreachable", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		cc := pool.Config().ConnConfig.Copy()
		cc.Port = 1 // nothing listens there
		var errs atomic.Int64
		got := make(chan struct{})
		l := outboxdb.NewListener(outboxdb.ListenerConfig{
			ConnConfig: cc, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			OnError: func(error) {
				if errs.Add(1) == 3 {
					close(got)
				}
			},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Run(ctx)
		}()
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("listener did not keep retrying")
		}
		cancel()
		<-done
	})
}
