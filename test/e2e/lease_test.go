package e2e_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// Every configuration start-up accepts must deliver (docs/guarantees.md):
// the shortest lease it accepts is FORWARD_TIMEOUT plus a little, and rows
// held in memory behind a full set of requests must keep their claims by
// renewal rather than be given back unsent, over and over, without an
// attempt ever being made.

// TestShortLeaseKillNine runs a 15 000-message backlog with the shortest
// lease worth having, CLAIM_LEASE = FORWARD_TIMEOUT + 1 s (3 s and 2 s),
// the default 5 attempts, and kills the forwarder with SIGKILL three times,
// restarting it each time. Every row must end SUCCESS, nothing lost, and no
// row may loop: none runs out of its attempts (each kill costs the rows in
// flight at most one attempt), and no process gives a claim back for lack
// of lease (forwarder_claims_returned_total{reason="lease"}, read before
// each kill and at the end, stays 0): the rows it holds keep their claims
// by renewal. The backlog is delivered at about 330 messages a second
// (100 requests of 100–500 ms): 15 000 take the three kills through
// ingestion and delivery in about a minute, where 30 000 kept the heavy
// lane two and a half minutes for the same checks.
func TestShortLeaseKillNine(t *testing.T) {
	scenario(t, heavy, 90*time.Second)
	s := newStack(t, stackOptions{
		env: map[string]string{
			"CLAIM_LEASE":          "3s",
			"FORWARD_TIMEOUT":      "2s",
			"FORWARD_MAX_ATTEMPTS": "5",
		},
		// 2400 rows held behind 100 requests of 100–500 ms wait up to about
		// seven seconds: longer than the lease minus the timeout, so the
		// claims that wait are kept by renewal.
		faults: mockplatform.Faults{Latency: 100 * time.Millisecond, LatencyJitter: 400 * time.Millisecond},
	})
	n := load(15_000, 6_000)
	s.produce(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01}), n)

	start := time.Now()
	p := s.start("forwarder-1", nil)
	// See TestKillNineUnderLoad: an instance is killed only once it owns
	// its partitions, or kfake keeps them assigned to the dead member.
	dead := map[string]bool{}
	member, _ := s.waitOwner(dead, time.Now(), time.Minute)

	// Kill moments: one random point of progress (rows persisted plus
	// deliveries accepted, 2n at the end) in each third of the run, so
	// kills fall during ingest and during delivery.
	const kills = 3
	var returned []string
	// giveBacks checks one process's give-backs for lack of lease.
	giveBacks := func(p *proc, m metrics) {
		t.Helper()
		if back := m.require(t, "forwarder_claims_returned_total", map[string]string{"reason": "lease"}); back > 0 {
			t.Errorf("%s gave %v claims back unsent for lack of lease while its renewals ran (forwarder_claims_returned_total: %s)",
				p.name, back, m.describe("forwarder_claims_returned_total"))
		}
	}
	for i := range kills {
		mark := int(float64(2*n) * (0.05 + 0.8*(float64(i)+s.rng.Float64())/kills))
		s.waitUntil(fmt.Sprintf("progress %d before kill %d", mark, i+1), 5*time.Minute, func(ctx context.Context) (bool, string) {
			got := s.progress(ctx)
			return got >= mark, "progress " + strconv.Itoa(got)
		})
		time.Sleep(time.Duration(s.rng.IntN(400)) * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m := mustScrape(t, ctx, p)
		counts, _ := s.rowCounts(ctx)
		cancel()
		st := s.platform.Stats()
		p.kill9(t)
		dead[member] = true
		giveBacks(p, m)
		returned = append(returned, fmt.Sprintf("%s: %s", p.name, m.describe("forwarder_claims_returned_total")))
		t.Logf("kill %d at %s (progress mark %d): rows %v, platform accepted %d, in flight %d; %s gave back %s, renewed %v leases, lost %v claims",
			i+1, time.Since(start).Round(time.Millisecond), mark, counts, st.Accepted, st.InFlight,
			p.name, m.describe("forwarder_claims_returned_total"), m.sum("forwarder_leases_renewed_total"), m.sum("forwarder_claims_lost_total"))
		p = s.start(fmt.Sprintf("forwarder-%d", i+2), nil)
		member, _ = s.waitOwner(dead, time.Now(), time.Minute)
	}
	s.waitSettled(6 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := mustScrape(t, ctx, p)
	giveBacks(p, last)
	returned = append(returned, fmt.Sprintf("%s (alive at the end): %s", p.name, last.describe("forwarder_claims_returned_total")))
	r := s.verify()

	// verify requires every good message SUCCESS: none FAILED out of
	// attempts. Each kill costs the rows it caught in flight one attempt.
	if r.maxAttempts > kills+1 {
		attempts := s.attemptHistogram(ctx)
		t.Errorf("a row used %d attempts with %d kills (attempt_count → rows: %v): rows are retried beyond what the kills explain",
			r.maxAttempts, kills, attempts)
	}
	t.Logf("lease 3s, timeout 2s, %d-message backlog, kill -9 x%d: %s; settled %s after start; attempt_count → rows %v; "+
		"give-backs per process (forwarder_claims_returned_total by reason): %s",
		n, kills, r, time.Since(start).Round(time.Millisecond), s.attemptHistogram(ctx), strings.Join(returned, "; "))
}

// TestPlatformJustUnderTimeout runs a backlog against a platform that
// answers each request in 0.9 × FORWARD_TIMEOUT, with CLAIM_LEASE =
// FORWARD_TIMEOUT + 1 s and the default 2400 held rows behind 100 requests
// in flight: the tail of what is held waits several request rounds, far
// longer than one lease (up to fifteen rounds of 2.7 s against a lease
// of 4 s), so only lease renewal keeps those claims. Every
// row must be delivered, each with one attempt (a request that the loaded
// machine pushes past the timeout is retried; such rows are reported and
// must show a timeout in their attempt log), none given back for lack of
// lease, and no held claim may expire while the process lives (no
// LEASE_EXPIRED attempt log, no claim found lost).
func TestPlatformJustUnderTimeout(t *testing.T) {
	scenario(t, light, 70*time.Second)
	const timeout = 3 * time.Second
	s := newStack(t, stackOptions{
		env: map[string]string{
			"CLAIM_LEASE":          (timeout + time.Second).String(),
			"FORWARD_TIMEOUT":      timeout.String(),
			"FORWARD_MAX_ATTEMPTS": "5",
		},
		faults: mockplatform.Faults{Latency: timeout * 9 / 10, LatencyJitter: 50 * time.Millisecond},
	})
	// 1 500 messages are fifteen rounds of 100 requests, all held at
	// once: the last wait fourteen rounds.
	n := load(1_500, 1_000)
	s.produce(s.newSource(eventgen.SourceConfig{}), n)

	start := time.Now()
	p := s.start("forwarder", nil)
	s.waitSettled(5 * time.Minute)
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := mustScrape(t, ctx, p)
	r := s.verify()

	var expired int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_retry_logs WHERE result_status = 'LEASE_EXPIRED'`).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if expired > 0 {
		t.Errorf("%d LEASE_EXPIRED attempt logs while the only instance was alive: held claims ran out", expired)
	}
	if lost := m.require(t, "forwarder_claims_lost_total", nil); lost > 0 {
		t.Errorf("forwarder_claims_lost_total = %v: renewals found held claims lost", lost)
	}
	if back := m.require(t, "forwarder_claims_returned_total", map[string]string{"reason": "lease"}); back > 0 {
		t.Errorf("forwarder_claims_returned_total{reason=\"lease\"} = %v: rows were given back unsent for lack of lease while renewals run", back)
	}
	if renewed := m.require(t, "forwarder_leases_renewed_total", nil); renewed == 0 {
		t.Errorf("forwarder_leases_renewed_total = 0: no lease was renewed, so the scenario did not hold rows past one lease")
	}

	// Rows that needed more than one attempt: each earlier attempt must be
	// a request that timed out (the machine, not the lease, made it late).
	rows, err := s.pool.Query(ctx, `SELECT r.message_key, r.attempt_count, l.attempt_number, l.result_status, coalesce(l.error_message, '')
		FROM forward_records r JOIN forward_retry_logs l ON l.record_id = r.id
		WHERE r.attempt_count > 1 AND l.result_status <> 'SUCCESS' ORDER BY r.id, l.attempt_number`)
	if err != nil {
		t.Fatal(err)
	}
	retried := map[string]bool{}
	var unexplained []string
	for rows.Next() {
		var key, status, msg string
		var attempts, number int
		if err := rows.Scan(&key, &attempts, &number, &status, &msg); err != nil {
			t.Fatal(err)
		}
		retried[key] = true
		if !timedOut.MatchString(msg) && len(unexplained) < 10 {
			unexplained = append(unexplained, fmt.Sprintf("%s attempt %d/%d %s: %q", key, number, attempts, status, msg))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(unexplained) > 0 {
		t.Errorf("rows retried for another reason than a request timeout:\n  %s", strings.Join(unexplained, "\n  "))
	}
	t.Logf("platform latency %s (+≤50ms) with timeout %s and lease %s, %d messages: settled in %s; %s; "+
		"%d rows needed more than one attempt (timeouts), attempt_count → rows %v; leases renewed %v, claims lost %v, give-backs %s",
		timeout*9/10, timeout, timeout+time.Second, n, took.Round(time.Millisecond), r, len(retried), s.attemptHistogram(ctx),
		m.sum("forwarder_leases_renewed_total"), m.sum("forwarder_claims_lost_total"), m.describe("forwarder_claims_returned_total"))
}

// timedOut matches the error text of a request cut by its timeout.
var timedOut = regexp.MustCompile(`(?i)timeout|deadline exceeded|timed out`)

// attemptHistogram maps attempt_count to the number of rows with it.
func (s *stack) attemptHistogram(ctx context.Context) map[int]int {
	out := map[int]int{}
	rows, err := s.pool.Query(ctx, `SELECT attempt_count, count(*) FROM forward_records GROUP BY 1`)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var a, c int
		if rows.Scan(&a, &c) == nil {
			out[a] = c
		}
	}
	return out
}
