package e2e_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestReadOnlyDatabaseIsWaitedFor: the service started on a database that
// takes no writes (default_transaction_read_only, as a standby's sessions
// are) answers pings, so it used to connect, fail every claim at ERROR once
// a second and answer /ready 200. It waits for it instead, as for a
// database that does not answer: /ready 503, no row written, one warning
// naming the cause and target_session_attrs, no "Failed to read message";
// once the database takes writes again every message is delivered once.
// (Ingest, whose wait backs off less, used to insert rows claimed for the
// dispatcher still waiting: their leases ran out unrenewed and about 200 of
// the 300 messages were sent twice.)
func TestReadOnlyDatabaseIsWaitedFor(t *testing.T) {
	scenario(t, heavy, 12*time.Second)
	s := newStack(t, stackOptions{})
	pgtest.SetForDatabase(t, s.pool, "default_transaction_read_only", "on")
	p := s.start("forwarder-a", nil)
	const n = 300
	s.produce(s.newSource(eventgen.SourceConfig{}), n)

	s.waitUntil("the wait for a database that takes writes", time.Minute, func(context.Context) (bool, string) {
		return p.countLines("Waiting for the outbox database", "accepts no writes", "target_session_attrs=read-write") > 0, "no such warning yet"
	})
	time.Sleep(3 * time.Second) // what would have been three failed claims
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if code, _, err := p.get(ctx, "/ready"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("/ready on a read-only database: %d (%v), want 503", code, err)
	}
	if c, err := s.rowCounts(ctx); err != nil || total(c) != 0 {
		t.Errorf("rows on a read-only database: %v (%v), want none", c, err)
	}
	if k := p.countLines("Failed to read message"); k > 0 {
		t.Errorf("%d failed reads logged while waiting:\n%s", k, p.tail(3000))
	}
	if k := p.countLines("Waiting for the outbox database"); k > 3 {
		t.Errorf("the wait is logged %d times, want once per component at most:\n%s", k, p.tail(3000))
	}

	pgtest.SetForDatabase(t, s.pool, "default_transaction_read_only", "")
	s.waitSettled(2 * time.Minute)
	r := s.verify()
	if r.dupDeliveries > 0 {
		t.Errorf("%d messages were delivered more than once:%s\n%s", r.dupMessages, s.dupHistory(r), p.tail(4000))
	}
	s.waitUntil("/ready 200", 30*time.Second, func(ctx context.Context) (bool, string) {
		code, _, err := p.get(ctx, "/ready")
		return err == nil && code == http.StatusOK, "not ready"
	})
	t.Logf("read-only, then writable: %s", r)
}
