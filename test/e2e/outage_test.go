package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestPostgresRestart stops PostgreSQL ("fast": every connection dropped)
// while the forwarder ingests and delivers, with requests in flight at a
// platform that takes its time, produces more messages while it is down,
// and starts it again. The same process must recover on its own, without a
// restart, and lose nothing.
func TestPostgresRestart(t *testing.T) {
	scenario(t, heavy, 22*time.Second)
	pg := pgtest.StartCluster(t)
	s := newStack(t, stackOptions{cluster: pg, faults: mockplatform.Faults{Latency: 20 * time.Millisecond, LatencyJitter: 100 * time.Millisecond}})
	n1, n2 := load(4_000, 1_500), load(2_000, 500)
	src := s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01, MalformedRate: 0.01})
	s.produce(src, n1)
	p := s.start("forwarder", nil)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= int64(n1/4) && st.InFlight >= 20 }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	counts, _ := s.rowCounts(ctx)
	if err := pg.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	downAt := time.Now()
	acceptedAtStop := s.platform.Stats().Accepted
	s.produce(src, n2)
	// An outage long enough for every connection, LISTEN and claim loop to
	// notice and start retrying.
	time.Sleep(4 * time.Second)
	if p.Exited() {
		t.Fatalf("the forwarder exited while PostgreSQL was down (%v):\n%s", p.Err(), p.tail(6000))
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	t.Logf("PostgreSQL stopped with rows %v and %d accepted, down for %s while %d more messages were produced",
		counts, acceptedAtStop, upAt.Sub(downAt).Round(time.Millisecond), n2)

	s.waitSettled(2 * time.Minute)
	if p.Exited() || p.signalled.Load() != 0 {
		t.Fatalf("the forwarder (pid %d) did not survive the database restart (%v):\n%s", p.Pid(), p.Err(), p.tail(6000))
	}
	r := s.verify()
	// Benthos answers /ready with 200 only when every input and output is
	// connected: the process is whole again, not just done with this load.
	s.waitUntil("/ready after the database restart", time.Minute, func(ctx context.Context) (bool, string) {
		code, body, err := p.get(ctx, "/ready")
		return err == nil && code == 200, fmt.Sprintf("status %d, %v: %s", code, err, body)
	})
	t.Logf("recovered in the same process (pid %d), settled %s after PostgreSQL came back: %s",
		p.Pid(), time.Since(upAt).Round(time.Millisecond), r)
}

// TestPostgresCrashLosesNothing crashes PostgreSQL, running with production
// durability, in the middle of a load (immediate stop: no checkpoint, no
// clean shutdown), twice. Claims, lease renewals and result writes commit
// without waiting for the WAL flush, so the crash may lose the latest of
// them; only the insert before an offset commit must survive. What was lost
// is sent again (the platform answers a repeat as a duplicate): nothing is
// lost and every message ends SUCCESS (docs/architecture.md, "What may commit
// asynchronously").
func TestPostgresCrashLosesNothing(t *testing.T) {
	scenario(t, heavy, 20*time.Second)
	pg := pgtest.StartDurableCluster(t)
	s := newStack(t, stackOptions{cluster: pg, faults: mockplatform.Faults{Latency: 5 * time.Millisecond, LatencyJitter: 20 * time.Millisecond}})
	src := s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01})
	n := load(6_000, 2_000)
	s.produce(src, n)
	p := s.start("forwarder", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for round, share := range []int64{4, 2} {
		// Mid-flow: results and claims are being written as the server dies.
		if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool {
			return st.Accepted >= int64(n)/share && st.InFlight > 0
		}); err != nil {
			s.dumpLogs()
			t.Fatal(err)
		}
		if err := pg.Stop("immediate"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if err := pg.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("crash %d at %d accepted", round+1, s.platform.Stats().Accepted)
	}
	s.waitSettled(3 * time.Minute)
	if p.Exited() {
		t.Fatalf("the forwarder did not survive the crashes (%v):\n%s", p.Err(), p.tail(6000))
	}
	r := s.verify()
	st := s.platform.Stats()
	t.Logf("after two crashes: %s; the platform answered %d repeats as duplicates", r, st.Duplicates)
}

// TestPlatformHang makes the platform accept connections and never answer.
// Ingestion must go on regardless (docs/guarantees.md #2): every message persisted
// and the consumer group's offsets committed up to the end of every
// partition while nothing at all has been delivered. Once the platform
// answers again, everything is delivered.
func TestPlatformHang(t *testing.T) {
	scenario(t, light, 13*time.Second)
	s := newStack(t, stackOptions{})
	n := load(5_000, 1_500)
	s.platform.Hang()
	s.produce(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MalformedRate: 0.01, MissingIDRate: 0.01}), n)
	start := time.Now()
	s.start("forwarder", nil)

	want := s.exp.rows()
	s.waitPersisted(want, 3*time.Minute)
	ingested := time.Since(start)
	// Ingestion may finish before the first claim on a loaded machine: the
	// dispatcher runs if requests reach the platform, while it hangs.
	s.waitUntil("a request held by the hanging platform (the dispatcher running)", time.Minute, func(context.Context) (bool, string) {
		st := s.platform.Stats()
		return st.Hung > 0, fmt.Sprintf("platform %+v", st)
	})
	st := s.platform.Stats()
	if st.Accepted > 0 {
		t.Fatalf("the hanging platform accepted %d messages", st.Accepted)
	}
	t.Logf("platform hanging: all %d rows persisted and offsets committed to the end in %s, with %d requests held and none answered",
		want, ingested.Round(time.Millisecond), st.Hung)

	s.platform.Release()
	releasedAt := time.Now()
	s.waitSettled(3 * time.Minute)
	t.Logf("drained in %s after the platform answered again: %s", time.Since(releasedAt).Round(time.Millisecond), s.verify())
}

// TestPlatformDownMidFlowIngestsAtFullSpeed takes the platform away while a
// backlog is being delivered and the ingest paces itself to the dispatcher's
// room (docs/components.md, "Direct dispatch"): once the breaker is open the
// ingest waits for room no more, so every message produced meanwhile is
// persisted and its offset committed while nothing is delivered
// (docs/guarantees.md #2), and once the platform is back everything is
// delivered; no row ends FAILED, though the outage outlasts a row's
// attempts. TestPlatformHang covers a platform that hangs from the start,
// when no row has ever left the dispatcher.
func TestPlatformDownMidFlowIngestsAtFullSpeed(t *testing.T) {
	scenario(t, light, 15*time.Second)
	const roomWaits = "forwarder_ingest_room_wait_seconds"
	// A small dispatcher and a slow platform under a steady load of 300
	// messages a second: the room fills at once, and the ingest waits while
	// rows leave, 80 a second. (A backlog there before the start is not
	// waited for: no row has left yet.)
	env := merged(shortAttempts, map[string]string{
		"OUTBOX_MAX_UNACKED":    "200",
		"FORWARD_MAX_IN_FLIGHT": "4",
	})
	s := newStack(t, stackOptions{env: env, faults: mockplatform.Faults{Latency: 50 * time.Millisecond}})
	src := s.newSource(eventgen.SourceConfig{})
	p := s.start("forwarder", nil)
	p.waitUp(t, time.Minute)
	stopLoad := s.steadyLoad(src, 300)
	defer stopLoad()
	n := load(3_000, 1_500)

	waits := func(ctx context.Context) (uint64, error) {
		m, err := scrapeMetrics(ctx, p)
		if err != nil {
			return 0, err
		}
		n, found := m.observations(roomWaits, nil)
		if !found {
			return 0, fmt.Errorf("no histogram %s in /metrics: %s", roomWaits, m.describe(roomWaits))
		}
		return n, nil
	}
	s.waitUntil("the ingest waiting for room while delivery moves", time.Minute, func(ctx context.Context) (bool, string) {
		n, err := waits(ctx)
		if err != nil {
			return false, err.Error()
		}
		st := s.platform.Stats()
		return n > 0 && st.Accepted > 0, fmt.Sprintf("%d waits, platform %+v", n, st)
	})

	s.platform.SetDown(true, 0)
	s.waitUntil("the breaker opens", 15*time.Second, func(ctx context.Context) (bool, string) {
		st := s.breakerState(ctx)
		return st == "OPEN", st
	})
	// A chunk may still wait (50 ms at most) for the rows the platform's
	// last replies let go; none starts a wait once the dispatcher knows.
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before, err := waits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.produce(src, n)
	time.Sleep(2 * time.Second)
	stopLoad()
	want := s.exp.rows()
	s.waitPersisted(want, 2*time.Minute)
	ingested := time.Since(start)
	after, err := waits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.breakerState(ctx); st != "OPEN" {
		t.Fatalf("the breaker is %s once the second batch was persisted: the ingest was not watched while sending was held", st)
	}
	if after != before {
		t.Errorf("the ingest waited for the dispatcher's room %d times while the breaker was open (%d before it opened)", after-before, before)
	}
	// The outage has outlasted a row's three attempts (100-400 ms apart).
	if failed := s.countStatus(ctx, "FAILED"); failed != 0 {
		t.Errorf("%d rows FAILED during the outage; their attempts:\n  %s", failed, strings.Join(s.attemptsOf(ctx, "FAILED", 5), "\n  "))
	}
	t.Logf("platform down, breaker open: a burst of %d messages and 300 a second persisted and committed in %s; %d waits for room before the outage, %d during it",
		n, ingested.Round(time.Millisecond), before, after-before)

	if err := s.platform.SetFaults(mockplatform.Faults{}); err != nil {
		t.Fatal(err)
	}
	s.platform.SetDown(false, 0)
	upAt := time.Now()
	s.waitSettled(2 * time.Minute)
	t.Logf("drained in %s after the platform came back: %s", time.Since(upAt).Round(time.Millisecond), s.verify())
}

// waitPersisted waits until the outbox holds want rows and the consumer
// group's offsets are committed to the end of every partition: everything
// produced is persisted, whatever was delivered.
func (s *stack) waitPersisted(want int, within time.Duration) {
	s.t.Helper()
	s.waitUntil(fmt.Sprintf("all %d rows persisted and the offsets committed to the end", want), within,
		func(ctx context.Context) (bool, string) {
			c, err := s.rowCounts(ctx)
			if err != nil {
				return false, err.Error()
			}
			lag := s.lag(ctx)
			return total(c) == want && lag == 0, fmt.Sprintf("rows %v of %d, consumer lag %d, platform %+v", c, want, lag, s.platform.Stats())
		})
}

// lag is the group's total lag over both topics: end offsets minus committed
// offsets (a partition without a commit lags by its whole length). -1 when
// the offsets cannot be read.
func (s *stack) lag(ctx context.Context) int64 {
	admin := s.kafka.Admin(s.t)
	ends, err := admin.ListEndOffsets(ctx, topicVehicle, topicHeartbeat)
	if err != nil {
		return -1
	}
	committed, err := admin.FetchOffsets(ctx, s.group)
	if err != nil {
		return -1
	}
	var lag int64
	for topic, ps := range ends {
		for p, end := range ps {
			if end.Err != nil {
				return -1
			}
			at := int64(0)
			if c, ok := committed.Lookup(topic, p); ok && c.Err == nil && c.At >= 0 {
				at = c.At
			}
			lag += end.Offset - at
		}
	}
	return lag
}
