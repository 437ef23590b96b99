package streamdb

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	"github.com/forwarder/forwarder/internal/testsupport/tcpproxy"
)

func TestConnectDelay(t *testing.T) {
	t.Parallel()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := connectDelay(i+1, connectRetryInitial, connectRetryMax); got != w {
			t.Errorf("delay after attempt %d: %v, want %v", i+1, got, w)
		}
	}
	if got := connectDelay(1000, connectRetryInitial, connectRetryMax); got != connectRetryMax {
		t.Errorf("delay after attempt 1000: %v, want the cap %v", got, connectRetryMax)
	}
}

// syncBuffer is a log sink written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestOpenWaitsForTheDatabase: while the database does not answer, Open
// keeps trying with backoff instead of failing (the engine would call it
// again once a second, logging each failure), says once what it waits
// for, and returns the pool once the database answers, saying so; a
// shutdown ends the wait at once.
func TestOpenWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, u.Host, tcpproxy.Options{Refusing: true})
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()

	var logs syncBuffer
	h, err := New(u.String())
	if err != nil {
		t.Fatal(err)
	}
	h.log = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	h.retryInitial, h.retryMax = 20*time.Millisecond, 80*time.Millisecond

	type result struct {
		err error
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		pool, err := h.Open(ctx)
		if err == nil {
			h.Release()
			_ = pool
		}
		done <- result{err}
	}()

	// Down: Open keeps trying, and logs the wait once.
	for proxy.Dials() < 10 {
		select {
		case r := <-done:
			t.Fatalf("Open returned %v while the database was down: it must wait", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	out := logs.String()
	if n := strings.Count(out, "Waiting for the outbox database "+h.Database); n != 1 {
		t.Errorf("after %d attempts the wait is logged %d times, want once:\n%s", proxy.Dials(), n, out)
	}
	if strings.Count(out, "\n") != 1 {
		t.Errorf("more than the one line about the wait at INFO and above:\n%s", out)
	}

	// Up: Open returns the pool, and says the wait is over.
	proxy.Refuse(false)
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Open after the database came back: %v", r.err)
		}
	case <-ctx.Done():
		t.Fatal("Open did not return once the database answered")
	}
	if !strings.Contains(logs.String(), "The outbox database "+h.Database+" answers again") {
		t.Errorf("the end of the wait is not logged:\n%s", logs.String())
	}

	// A lost connection: Recheck waits too, trying again after the first
	// delay each time (its rows wait for it), and a shutdown ends the wait
	// at once with the context's error.
	proxy.Refuse(true)
	logs.mu.Lock()
	logs.b.Reset()
	logs.mu.Unlock()
	h.log = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	pool, err := h.Retain()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	sctx, stop := context.WithCancel(context.Background())
	go func() { done <- result{h.Recheck(sctx, pool)} }()
	for strings.Count(logs.String(), "still unreachable") < 4 {
		select {
		case r := <-done:
			t.Fatalf("Recheck returned %v while the database was down: it must wait", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	// Open's attempts doubled up to 80ms; Recheck's are 20ms apart however
	// many fail.
	out = logs.String()
	if !strings.Contains(out, "Retrying every 20ms") {
		t.Errorf("Recheck's wait does not say it retries every 20ms:\n%s", out)
	}
	nexts := regexp.MustCompile(`next in ([^):]+)\)`).FindAllStringSubmatch(out, -1)
	for _, m := range nexts {
		if m[1] != "20ms" {
			t.Errorf("Recheck waits %s before an attempt, want 20ms each time:\n%s", m[1], out)
			break
		}
	}
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Recheck cancelled while waiting: %v, want context.Canceled", r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Recheck did not return when its context was cancelled")
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	err := errors.New("migrating: failed to connect to `user=u database=x`:\n\t127.0.0.1:1 (127.0.0.1): dial error: refused\n\t127.0.0.1:1 (127.0.0.1): dial error: refused\n\t[::1]:1 (::1): dial error: refused")
	want := "migrating: failed to connect to `user=u database=x`: 127.0.0.1:1 (127.0.0.1): dial error: refused; [::1]:1 (::1): dial error: refused"
	if got := oneLine(err); got != want {
		t.Errorf("oneLine:\n got %q\nwant %q", got, want)
	}
}

// TestOpenAndRecheckWaitForWrites: a database whose sessions are read-only
// (a standby, or default_transaction_read_only set by an administrator)
// answers pings, so the components used to connect and then fail every
// write, logging an error a second. Open and Recheck now wait for it as
// for a database that does not answer, saying why once, and follow it once
// new sessions may write: the pool's sessions, which keep the read-only
// default they started with, are closed at each refusal.
func TestOpenAndRecheckWaitForWrites(t *testing.T) {
	t.Parallel()
	dsn, admin := pgtest.NewDBPool(t)

	var logs syncBuffer
	h, err := New(dsn)
	if err != nil {
		t.Fatal(err)
	}
	h.log = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	h.retryInitial, h.retryMax = 20*time.Millisecond, 80*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waiting := func(done chan error, what string) {
		t.Helper()
		for !strings.Contains(logs.String(), "accepts no writes") {
			select {
			case err := <-done:
				t.Fatalf("%s returned %v on a read-only database: it must wait", what, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		select {
		case err := <-done:
			t.Fatalf("%s returned %v on a read-only database: it must wait", what, err)
		case <-time.After(300 * time.Millisecond):
		}
		out := logs.String()
		if n := strings.Count(out, "Waiting for the outbox database "+h.Database+": "); n != 1 || strings.Count(out, "\n") != 1 ||
			!strings.Contains(out, "target_session_attrs=read-write") {
			t.Errorf("%s: the wait is not logged once, naming target_session_attrs:\n%s", what, out)
		}
	}
	writable := func(done chan error, what string) {
		t.Helper()
		pgtest.SetReadOnly(t, admin, false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s once the database takes writes: %v", what, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s did not return once new sessions could write", what)
		}
		if !strings.Contains(logs.String(), "The outbox database "+h.Database+" answers again") {
			t.Errorf("%s: the end of the wait is not logged:\n%s", what, logs.String())
		}
	}

	pgtest.SetReadOnly(t, admin, true)
	done := make(chan error, 1)
	go func() {
		_, err := h.Open(ctx)
		done <- err
	}()
	waiting(done, "Open")
	writable(done, "Open")
	defer h.Release()

	// A failover that put the pool's sessions on a standby: a write fails,
	// and Recheck waits until it can write again.
	pool, err := h.Retain()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	pgtest.SetReadOnly(t, admin, true)
	pool.Reset()
	_, err = pool.Exec(ctx, "CREATE TABLE written_on_a_standby (id int)")
	if err = outboxdb.WhenReadOnly(pool, err); !errors.Is(err, outboxdb.ErrReadOnly) || !strings.Contains(err.Error(), "SQLSTATE 25006") {
		t.Fatalf("a write on a read-only session: %v, want ErrReadOnly with PostgreSQL's error", err)
	}
	logs.mu.Lock()
	logs.b.Reset()
	logs.mu.Unlock()
	go func() { done <- h.Recheck(ctx, pool) }()
	waiting(done, "Recheck")
	writable(done, "Recheck")
}

// TestOpenFollowsAMigrationAtOnce: a migration in progress (another
// instance's, started at the same time) is not an outage to back off from:
// Open looks again every retryInitial and returns as soon as the migration
// ends. With the doubling delay it returned up to that delay later, the
// instance idle meanwhile.
func TestOpenFollowsAMigrationAtOnce(t *testing.T) {
	t.Parallel()
	dsn, _ := pgtest.NewDBPool(t)
	h, err := New(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Doubling from 20 ms, a wait that began 2.6 s before the migration
	// ended would next look 2.5 s after it.
	h.retryInitial, h.retryMax = 20*time.Millisecond, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	endMigration := pgtest.HoldMigrationLock(t, dsn)
	done := make(chan error, 1)
	go func() {
		_, err := h.Open(ctx)
		done <- err
	}()
	time.Sleep(2600 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Open returned %v during the migration", err)
	default:
	}
	endMigration()
	ended := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
	case <-time.After(1500 * time.Millisecond):
		t.Fatalf("Open had not returned %v after the migration ended: it backs off from a migration as from an outage", time.Since(ended).Round(time.Millisecond))
	}
}
