package e2e_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
)

// TestThreeInstances starts three forwarders at the same moment on one
// empty database (they race to create the schema, docs/architecture.md) and one
// consumer group. Every message is delivered exactly once: SKIP LOCKED
// claims and the leases keep any two instances from sending the same row
// (docs/guarantees.md #4).
func TestThreeInstances(t *testing.T) {
	scenario(t, heavy, 12*time.Second)
	// No instance dies here, so a long lease costs nothing; the stack's 3 s
	// lease is for the crash scenarios, and three forwarders on two starved
	// cores can let a claim outlive it, which is a slow instance, not two
	// instances owning a row.
	s := newStack(t, stackOptions{emptyDB: true, env: map[string]string{"CLAIM_LEASE": "20s"}})
	n := load(9_000, 3_000)
	s.produce(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MalformedRate: 0.01, MissingIDRate: 0.01}), n)

	// Started together, then waited for: the migrations race for real.
	start := time.Now()
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = startProc(t, fmt.Sprintf("forwarder-%c", 'a'+i), s.env)
	}
	s.track(procs...)
	for _, p := range procs {
		p.waitUp(t, 60*time.Second)
	}
	s.waitSettled(4 * time.Minute)
	took := time.Since(start)
	r := s.verify()
	if r.dupDeliveries > 0 {
		t.Errorf("%d duplicate deliveries (%d messages sent more than once) with three instances and no crash; want none:%s",
			r.dupDeliveries, r.dupMessages, s.dupHistory(r))
	}

	// Who did the work: the last claimer of each delivered row.
	ctx := context.Background()
	rows, err := s.pool.Query(ctx, `SELECT coalesce(claimed_by, '(none)'), count(*) FROM forward_records
		WHERE status = 'SUCCESS' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var shares []string
	claimers := 0
	for rows.Next() {
		var who string
		var c int
		if err := rows.Scan(&who, &c); err != nil {
			t.Fatal(err)
		}
		shares = append(shares, fmt.Sprintf("%s: %d", who, c))
		claimers++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(shares)
	if claimers < 2 {
		t.Errorf("rows were delivered by %d instance(s) (%s); want the work shared", claimers, strings.Join(shares, ", "))
	}
	t.Logf("3 instances, %d messages, settled in %s: %s; delivered rows by instance: %s",
		n, took.Round(time.Millisecond), r, strings.Join(shares, ", "))
}
