package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestFailoverToSynchronousStandby runs the forwarder against a primary with
// a synchronous streaming standby (pg_basebackup -R,
// synchronous_standby_names), DATABASE_URL naming both hosts with
// target_session_attrs=read-write (docs/deployment.md, "Failover"). Under a
// steady 200 messages a second the primary is stopped in immediate mode (a
// crash) and the standby promoted. The same process, never restarted, must
// follow the new primary and lose nothing: every message SUCCESS on the new
// primary (docs/guarantees.md #9 and #14). Meanwhile no row may stay
// IN_PROGRESS past its lease (or past the promotion, for a lease that ended
// while no server took writes) by more than the time a dispatcher takes to
// claim it again; and once the load is over, rows inserted on the new
// primary by another process are attempted at once, so the LISTEN
// connection listens there, not at the next poll.
func TestFailoverToSynchronousStandby(t *testing.T) {
	scenario(t, alone, 45*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	primary := pgtest.StartCluster(t)
	standby, err := primary.StartStandby(ctx, t.TempDir()+"/standby/data", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Remove() })
	makeSynchronous(t, primary)

	const lease = 3 * time.Second
	s := newStack(t, stackOptions{cluster: primary,
		faults: mockplatform.Faults{Latency: time.Millisecond, LatencyJitter: 10 * time.Millisecond},
		env:    map[string]string{"CLAIM_LEASE": lease.String()}})
	both := bothHosts(t, s.dsn, primary.Port, standby.Port)
	s.env["DATABASE_URL"] = both
	s.pool.Close()
	if s.pool, err = pgxpool.New(ctx, both); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.pool.Close)

	src := s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01})
	stopLoad := s.steadyLoad(src, 200)
	defer stopLoad()
	p := s.start("forwarder", nil)
	before := time.Duration(load(15, 8)) * time.Second
	time.Sleep(before)

	// Rows left IN_PROGRESS past their lease: sampled every half second
	// from here to the end (errors while no primary is up are skipped).
	var promotedAt atomic.Pointer[time.Time]
	watch := watchOverdueClaims(s, 2*time.Second, &promotedAt)

	counts, _ := s.rowCounts(ctx)
	st := s.platform.Stats()
	failedAt := time.Now()
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	promotedAt.Store(&now)
	promoted := now.Sub(failedAt)
	t.Logf("primary crashed after %s of load with rows %v and %d accepted; standby promoted %s later",
		before, counts, st.Accepted, promoted.Round(time.Millisecond))

	time.Sleep(time.Duration(load(15, 8)) * time.Second)
	stopLoad()
	s.waitSettled(5 * time.Minute)
	if p.Exited() || p.signalled.Load() != 0 {
		t.Fatalf("the forwarder (pid %d) did not survive the failover (%v):\n%s", p.Pid(), p.Err(), p.tail(6000))
	}
	r := s.verify()
	overdue := watch()
	if len(overdue) > 0 {
		t.Errorf("rows stayed IN_PROGRESS more than 2s past their %s lease (or past the promotion, for a lease that ended before it): %s",
			lease, strings.Join(overdue, "; "))
	}
	var onNew int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM forward_records WHERE NOT pg_is_in_recovery()").Scan(&onNew); err != nil || onNew != r.rows {
		t.Fatalf("the new primary holds %d rows (%v), want all %d", onNew, err, r.rows)
	}

	// The LISTEN connection: on the new primary, a session of the service
	// whose last statement is LISTEN, started after the failover.
	s.waitUntil("the service's LISTEN session on the new primary", time.Minute, func(ctx context.Context) (bool, string) {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1
			  AND query LIKE 'LISTEN %' AND backend_start > $2`, outboxdb.ServiceApplicationName, failedAt).Scan(&n)
		return err == nil && n == 1, fmt.Sprintf("%d LISTEN sessions (%v)", n, err)
	})
	latencies := s.insertElsewhere(t, src, 7)
	median := latencies[len(latencies)/2]
	t.Logf("failover under 200 msg/s: %s; rows inserted on the new primary by another process were attempted after %v (median %s; the fallback poll is 5s)",
		r, latencies, median.Round(time.Millisecond))
	if median > time.Second {
		t.Errorf("rows inserted on the new primary waited %s (median) to be attempted: the notification did not wake the dispatcher, it found them by polling", median.Round(time.Millisecond))
	}
}

// makeSynchronous makes c wait for its standby before confirming a commit,
// and waits until the standby is streaming synchronously. It is set after
// the base backup, so that the standby, once promoted, does not wait for a
// standby of its own.
func makeSynchronous(t *testing.T, c *pgcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	for {
		var state string
		err := conn.QueryRow(ctx, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE state = 'streaming'").Scan(&state)
		if err == nil && state == "sync" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the standby never became a synchronous one (sync_state %q, %v)", state, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bothHosts is dsn (a URL to one server) naming both ports, for
// target_session_attrs=read-write to pick the primary.
func bothHosts(t *testing.T, dsn string, ports ...int) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	hosts := make([]string, len(ports))
	for i, p := range ports {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	u.Host = strings.Join(hosts, ",")
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return u.String()
}

// watchOverdueClaims samples the rows IN_PROGRESS whose lease ended more
// than grace ago, until the returned function is called; it returns one
// line per sample that found some. A lease that ended before the new
// primary was promoted (promotedAt, once set) counts from the promotion:
// nothing can claim a row while no server takes writes, and a loaded
// machine was seen to take 5 s to promote, longer than the lease.
func watchOverdueClaims(s *stack, grace time.Duration, promotedAt *atomic.Pointer[time.Time]) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var found []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			var n int
			var oldest *time.Duration
			// The table, not the view: see rowCounts.
			var since time.Time // the zero time: before the promotion
			if p := promotedAt.Load(); p != nil {
				since = *p
			}
			err := s.pool.QueryRow(qctx, `SELECT count(*), max(now() - greatest(next_retry_at, $2)) FROM forward_deliveries
				WHERE status = 'IN_PROGRESS' AND greatest(next_retry_at, $2) < now() - $1::bigint * interval '1 millisecond'`,
				grace.Milliseconds(), since).Scan(&n, &oldest)
			qcancel()
			if err == nil && n > 0 {
				mu.Lock()
				found = append(found, fmt.Sprintf("%s: %d rows, the oldest overdue for %s", time.Now().Format("15:04:05.000"), n, oldest.Round(time.Millisecond)))
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(found)
	}
}

// insertElsewhere inserts n heartbeats one by one, as another instance
// would (through the outbox's own insert, which notifies in its
// transaction), a little over a second apart, and returns how long each
// waited until the platform accepted it, shortest first.
func (s *stack) insertElsewhere(t *testing.T, src *eventgen.Source, n int) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var latencies []time.Duration
	for len(latencies) < n {
		m := src.Next()
		if m.Kind != eventgen.Heartbeat || m.MessageID == "" {
			continue
		}
		var fields struct {
			DeviceID  string `json:"deviceId"`
			ParkCode  string `json:"parkCode"`
			BerthCode string `json:"berthCode"`
		}
		_ = json.Unmarshal(m.Value, &fields)
		rec := outboxdb.NewRecord{MessageKey: m.MessageID, APIType: outboxdb.APITypeHeartbeat, KafkaTopic: m.Topic,
			KafkaPartition: 0, KafkaOffset: -1, KafkaKey: m.Key, Payload: m.Value, Status: outboxdb.StatusPending,
			DeviceID: fields.DeviceID, ParkCode: fields.ParkCode, BerthCode: fields.BerthCode}
		time.Sleep(1100 * time.Millisecond)
		if _, err := outboxdb.InsertBatchCount(ctx, s.pool, []outboxdb.NewRecord{rec}); err != nil {
			t.Fatal(err)
		}
		insertedAt := time.Now()
		if err := s.platform.WaitFor(ctx, func(mockplatform.Stats) bool {
			_, ok := s.platform.Delivery(m.MessageID)
			return ok
		}); err != nil {
			t.Fatalf("a row inserted on the new primary was never delivered: %v", err)
		}
		d, _ := s.platform.Delivery(m.MessageID)
		latencies = append(latencies, max(d.FirstAt.Sub(insertedAt), 0))
	}
	slices.Sort(latencies)
	return latencies
}
