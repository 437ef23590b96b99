package e2e_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/streamdb"
)

// TestThreeInstancesShortLease is TestThreeInstances with the shortest
// lease start-up accepts instead of 20 s: CLAIM_LEASE 3 s with
// FORWARD_TIMEOUT 1 s (FORWARD_MAX_IN_FLIGHT × lease / timeout = 300, below
// the 2400 rows each instance may hold, so rows wait in memory longer than a
// lease). The held leases are renewed, so no row may expire while its
// instance is alive and be sent by another: no message is delivered twice
// but after a request that timed out (docs/guarantees.md), no LEASE_EXPIRED attempt log, no
// claim lost, none given back for lack of lease, and leases were renewed
// (forwarder_leases_renewed_total > 0: rows were held that long). The platform takes a little time per request so that the
// instances do hold rows behind their requests.
//
// The messages are produced once each instance reads partitions, so that
// each ingests and holds a share. Produced before, the first instance up
// may read them all before the others join the group and hold the head of
// every berth (the generator's ~200); the others then get only the rows it
// leaves due for them (TestLateInstancesShareABerthBacklog).
func TestThreeInstancesShortLease(t *testing.T) {
	scenario(t, alone, 45*time.Second)
	s := newStack(t, stackOptions{
		emptyDB: true,
		env:     map[string]string{"CLAIM_LEASE": "3s", "FORWARD_TIMEOUT": "1s"},
		faults:  mockplatform.Faults{Latency: 300 * time.Millisecond, LatencyJitter: 400 * time.Millisecond},
	})
	n := load(9_000, 3_000)

	start := time.Now()
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = startProc(t, fmt.Sprintf("forwarder-%c", 'a'+i), s.env)
	}
	s.track(procs...)
	for _, p := range procs {
		p.waitUp(t, 60*time.Second)
	}
	s.waitPartitionsShared(procs, time.Minute)
	s.produce(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MalformedRate: 0.01, MissingIDRate: 0.01}), n)
	peakConns := s.sampleConnections()
	s.waitSettled(4 * time.Minute)
	took := time.Since(start)
	// Each instance holds its stream's pool, the LISTEN connection and the
	// metrics exporter's one (docs/configuration.md), whatever the load.
	if peak, limit := peakConns(), 3*(streamdb.DefaultMaxConns+2); peak > int(limit) {
		t.Errorf("three instances held %d PostgreSQL connections at the peak; want at most %d", peak, limit)
	} else {
		t.Logf("PostgreSQL connections of the three instances at the peak: %d (at most %d)", peak, limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var renewed, lost float64
	var returned []string
	for _, p := range procs {
		m := mustScrape(t, ctx, p)
		renewed += m.require(t, "forwarder_leases_renewed_total", nil)
		lost += m.require(t, "forwarder_claims_lost_total", nil)
		returned = append(returned, p.name+": "+m.describe("forwarder_claims_returned_total"))
		if back := m.require(t, "forwarder_claims_returned_total", map[string]string{"reason": "lease"}); back > 0 {
			t.Errorf("%s gave %v claims back unsent for lack of lease while its renewals ran", p.name, back)
		}
	}
	r := s.verify()

	// A request that times out (the platform answers after up to 0.7 s, the
	// timeout is 1 s, and a loaded machine adds the rest) is sent again:
	// at-least-once, which the platform's duplicate errcode is for. Any
	// other second delivery would be a lease that ran out under a live
	// instance.
	if r.unexplainedDups != 0 {
		t.Errorf("%d deliveries of %d messages delivered twice have no unanswered request to explain them, with three instances, a 3 s lease and no crash:%s",
			r.unexplainedDups, r.dupMessages, s.dupHistory(r))
		s.explainDuplicates(ctx)
	} else if r.dupDeliveries > 0 {
		t.Logf("%d deliveries sent again after a request timed out", r.dupDeliveries)
	}
	var expired int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_retry_logs WHERE result_status = 'LEASE_EXPIRED'`).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if expired > 0 {
		t.Errorf("%d LEASE_EXPIRED attempt logs with every instance alive: held claims ran out", expired)
	}
	if lost > 0 {
		t.Errorf("forwarder_claims_lost_total = %v over the instances: renewals found held claims taken by another", lost)
	}
	if renewed == 0 {
		t.Errorf("forwarder_leases_renewed_total = 0 over the instances: no lease was renewed, so no row was held past half a lease and the scenario proves nothing about renewals")
	}

	shares := s.deliveredBy(ctx)
	if len(shares) < 2 {
		t.Errorf("rows were delivered by %d instance(s) (%s); want the work shared", len(shares), strings.Join(shares, ", "))
	}
	t.Logf("3 instances, lease 3s, timeout 1s, %d messages, settled in %s: %s; leases renewed %v, claims lost %v, LEASE_EXPIRED logs %d; "+
		"give-backs %s; delivered rows by instance: %s",
		n, took.Round(time.Millisecond), r, renewed, lost, expired, strings.Join(returned, "; "), strings.Join(shares, ", "))
}

// waitPartitionsShared waits until every one of procs reads partitions of
// the consumer group (forwarder_kafka_partitions_assigned > 0) and together
// they read them all.
func (s *stack) waitPartitionsShared(procs []*proc, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	var last []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var total float64
		shared := true
		last = last[:0]
		for _, p := range procs {
			m, err := scrapeMetrics(ctx, p)
			n := m.sum("forwarder_kafka_partitions_assigned")
			if err != nil || n == 0 {
				shared = false
			}
			total += n
			last = append(last, fmt.Sprintf("%s: %v", p.name, n))
		}
		cancel()
		if shared && total == 2*partitions {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the group's %d partitions were not shared by the %d instances within %s: %s", 2*partitions, len(procs), within, strings.Join(last, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sampleConnections counts the forwarders' connections to the scenario's
// database every 100 ms until the returned function is called, which
// returns the peak.
func (s *stack) sampleConnections() (peak func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		max := 0
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name LIKE 'forwarder%'`).Scan(&n); err == nil && n > max {
				max = n
			}
			select {
			case <-ctx.Done():
				done <- max
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		cancel()
		return <-done
	}
}

// deliveredBy lists "<claimer>: <rows>" for the SUCCESS rows by their last
// claimer.
func (s *stack) deliveredBy(ctx context.Context) []string {
	s.t.Helper()
	rows, err := s.pool.Query(ctx, `SELECT coalesce(claimed_by, '(none)'), count(*) FROM forward_records
		WHERE status = 'SUCCESS' GROUP BY 1`)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var shares []string
	for rows.Next() {
		var who string
		var c int
		if err := rows.Scan(&who, &c); err != nil {
			s.t.Fatal(err)
		}
		shares = append(shares, fmt.Sprintf("%s: %d", who, c))
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	sort.Strings(shares)
	return shares
}

// explainDuplicates logs, for a few messages the platform received more
// than once, the row's attempt history: which claimer sent it when, and how
// each attempt ended, for a failure to say why.
func (s *stack) explainDuplicates(ctx context.Context) {
	shown := 0
	for _, d := range s.platform.Deliveries() {
		if d.Count < 2 || shown == 5 {
			continue
		}
		shown++
		rows, err := s.pool.Query(ctx, `SELECT l.attempt_number, l.result_status, coalesce(l.error_message, ''),
			l.attempted_at, coalesce(r.claimed_by, '')
			FROM forward_records r JOIN forward_retry_logs l ON l.record_id = r.id
			WHERE r.message_key = $1 ORDER BY l.id`, d.MessageID)
		if err != nil {
			s.t.Logf("attempt history of %s: %v", d.MessageID, err)
			continue
		}
		var lines []string
		for rows.Next() {
			var n int
			var status, msg, by string
			var at time.Time
			if rows.Scan(&n, &status, &msg, &at, &by) == nil {
				lines = append(lines, fmt.Sprintf("attempt %d %s at %s (last claimer %s): %q", n, status, at.Format(time.StampMilli), by, msg))
			}
		}
		rows.Close()
		s.t.Logf("%s accepted %d times (first %s, last %s):\n  %s", d.MessageID, d.Count,
			d.FirstAt.Format(time.StampMilli), d.LastAt.Format(time.StampMilli), strings.Join(lines, "\n  "))
	}
}

// TestLateInstancesShareABerthBacklog: one forwarder reads a whole backlog
// before two more start, so it holds the current event of every berth (the
// generator's ~200) and every later event of a berth waits behind it. The
// result write that ends a berth's event claims the next for the same
// instance (chained dispatch), which kept the backlog on the first instance
// while the latecomers, finding nothing due, sent nothing: three instances
// delivered at one's rate. An instance that finds nothing due says so, and
// the others then leave the next events due for whichever claims first
// (docs/architecture.md, "Chained dispatch"): the latecomers must deliver a
// share of what is left. The platform takes 300–700 ms a request, so the
// first instance's 100 request slots are the bottleneck it would be alone.
func TestLateInstancesShareABerthBacklog(t *testing.T) {
	scenario(t, alone, 40*time.Second)
	s := newStack(t, stackOptions{
		emptyDB: true,
		env:     map[string]string{"CLAIM_LEASE": "20s"},
		faults:  mockplatform.Faults{Latency: 300 * time.Millisecond, LatencyJitter: 400 * time.Millisecond},
	})
	n := load(6_000, 3_000)
	s.produce(s.newSource(eventgen.SourceConfig{}), n)

	first := s.start("forwarder-a", nil)
	s.waitUntil("the first instance to persist the whole backlog", time.Minute, func(ctx context.Context) (bool, string) {
		var rows int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_messages`).Scan(&rows); err != nil {
			return false, err.Error()
		}
		return rows >= s.exp.rows(), fmt.Sprintf("%d rows of %d", rows, s.exp.rows())
	})
	late := s.startAll("forwarder-b", "forwarder-c")
	var before int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	s.waitSettled(4 * time.Minute)
	r := s.verify()
	if r.dupDeliveries > 0 {
		t.Errorf("%d duplicate deliveries with no crash; want none:%s", r.dupDeliveries, s.dupHistory(r))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	shares := s.deliveredBy(ctx)
	var byLate int
	for _, p := range late {
		var c int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE status = 'SUCCESS' AND claimed_by = $1`, p.claimer()).Scan(&c); err != nil {
			t.Fatal(err)
		}
		byLate += c
	}
	left := r.delivered - before
	// Alone among three the first would send a third; the latecomers must
	// have sent a real share of what was left when they started.
	if byLate*5 < left {
		t.Errorf("the two instances started late delivered %d of the %d rows left once they were up; want at least a fifth (by instance: %s)",
			byLate, left, strings.Join(shares, ", "))
	}
	t.Logf("%d rows delivered by the time the two late instances were up, %d after, %d of them by the late two; by instance: %s (first: %s)",
		before, left, byLate, strings.Join(shares, ", "), first.name)
}
