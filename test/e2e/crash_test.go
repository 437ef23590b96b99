package e2e_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// load is a scenario's message count: full normally, small with -short.
func load(full, short int) int {
	if testing.Short() {
		return short
	}
	return full
}

// TestKillNineUnderLoad crashes the forwarder with SIGKILL at five random
// moments while it ingests and delivers a realistic load (with Kafka
// duplicates, malformed messages and messages without a messageId),
// restarting it each time. Every message must end delivered or FAILED with
// its reason, and no row may be left PENDING or IN_PROGRESS (docs/guarantees.md #1,
// #3). Duplicate deliveries (a request the crash cut short, sent again)
// are allowed and reported. Every restart, the last one included, must
// resume within 15 s of its kill (docs/guarantees.md #8): the time from the SIGKILL
// to the moment the group is Stable with the new instance as its only member
// and every partition assigned to it. Most of it is the 10 s session timeout
// that expires the killed member.
func TestKillNineUnderLoad(t *testing.T) {
	scenario(t, heavy, 75*time.Second)
	s := newStack(t, stackOptions{faults: mockplatform.Faults{Latency: time.Millisecond, LatencyJitter: 20 * time.Millisecond}})
	n := load(30_000, 4_000)
	src := s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MalformedRate: 0.01, MissingIDRate: 0.01})

	start := time.Now()
	wait := s.produceAsync(src, n)
	p := s.start("forwarder-1", nil)
	// The first instance owns its partitions before the first kill: kfake
	// (franz-go v1.22.3) never expires a member whose connection died while
	// its JoinGroup was pending (it stops the member's session timer during
	// the join and does not restart it when the reply cannot be delivered),
	// so a process killed while joining would keep its share of the
	// partitions forever, which Kafka itself does not do. Every later
	// instance is waited for the same way, which is what is measured.
	dead := map[string]bool{}
	member, _ := s.waitOwner(dead, time.Now(), time.Minute)

	// Kill moments are points of progress (rows persisted + deliveries
	// accepted, about 2n at the end), drawn at random and then delayed by a
	// random few hundred milliseconds, so they fall during ingest, during
	// delivery and in between (a mark already passed while the previous
	// restart resumed is a kill right after it).
	const kills = 5
	marks := make([]int, kills)
	for i := range marks {
		marks[i] = int(float64(2*n) * (0.03 + 0.85*s.rng.Float64()))
	}
	sort.Ints(marks)
	resumes := make([]time.Duration, 0, kills)
	for i, mark := range marks {
		s.waitUntil(fmt.Sprintf("progress %d before kill %d", mark, i+1), 5*time.Minute, func(ctx context.Context) (bool, string) {
			got := s.progress(ctx)
			return got >= mark, "progress " + strconv.Itoa(got)
		})
		time.Sleep(time.Duration(s.rng.IntN(400)) * time.Millisecond)
		counts, _ := s.rowCounts(context.Background())
		st := s.platform.Stats()
		killedAt := time.Now()
		p.kill9(t)
		dead[member] = true
		t.Logf("kill %d at %s (progress mark %d): rows %v, platform accepted %d, in flight %d",
			i+1, time.Since(start).Round(time.Millisecond), mark, counts, st.Accepted, st.InFlight)
		p = s.start(fmt.Sprintf("forwarder-%d", i+2), nil)
		var resumed time.Duration
		member, resumed = s.waitOwner(dead, killedAt, time.Minute)
		resumes = append(resumes, resumed)
		t.Logf("restart %d: forwarder-%d owns every partition %s after the kill", i+1, i+2, resumed.Round(time.Millisecond))
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	s.waitSettled(6 * time.Minute)
	r := s.verify()
	t.Logf("kill -9 x%d under %d messages: %s; settled %s after the first message; "+
		"time from each kill to the restarted instance owning every partition: %s",
		kills, n, r, time.Since(start).Round(time.Millisecond), summary(resumes))
	// docs/guarantees.md #8: a restarted instance resumes consuming within 15 s (the
	// pipeline's 10 s session timeout expires the killed member).
	if len(resumes) != kills {
		t.Fatalf("%d restarts timed, want %d", len(resumes), kills)
	}
	for i, d := range resumes {
		if d > resumeBound {
			t.Errorf("restart %d: the new instance owned every partition %s after the kill, want within %s", i+1, d.Round(time.Millisecond), resumeBound)
		}
	}
}

// resumeBound is docs/guarantees.md #8's bound on how soon a restarted instance
// consumes again.
const resumeBound = 15 * time.Second

// waitOwner waits until the running instance owns every partition: the
// consumer group is Stable with a single member that is not one of dead
// (earlier members, by member id), and that member is assigned every
// partition of both topics. It returns the member's id and the time from
// since to the first poll that saw it (an upper bound: the group got there
// at most one poll, about 100 ms, earlier).
func (s *stack) waitOwner(dead map[string]bool, since time.Time, within time.Duration) (string, time.Duration) {
	s.t.Helper()
	admin := s.kafka.Admin(s.t)
	var id string
	var took time.Duration
	s.waitUntil(fmt.Sprintf("group %s stable with the running instance as its only member, owning every partition", s.group), within,
		func(ctx context.Context) (bool, string) {
			gs, err := admin.DescribeGroups(ctx, s.group)
			if err != nil {
				return false, err.Error()
			}
			seen := time.Since(since)
			g := gs[s.group]
			state := fmt.Sprintf("state %q, %d members, err %v", g.State, len(g.Members), g.Err)
			if g.Err != nil || g.State != "Stable" || len(g.Members) != 1 || dead[g.Members[0].MemberID] {
				return false, state
			}
			assigned := g.AssignedPartitions()
			for _, topic := range []string{topicVehicle, topicHeartbeat} {
				for p := range int32(partitions) {
					if _, ok := assigned[topic][p]; !ok {
						return false, fmt.Sprintf("%s; %s/%d not assigned (assignment %v)", state, topic, p, assigned)
					}
				}
			}
			id, took = g.Members[0].MemberID, seen
			return true, state
		})
	return id, took
}

// TestOrphanedClaimsReclaimed crashes a forwarder while its requests are in
// flight: the rows it held stay IN_PROGRESS until their lease runs out, and
// then another instance claims them again (docs/guarantees.md #3), never
// before the lease has expired. The time from the crash to each reclaim is
// reported.
func TestOrphanedClaimsReclaimed(t *testing.T) {
	scenario(t, light, 8*time.Second)
	s := newStack(t, stackOptions{faults: mockplatform.Faults{Latency: 700 * time.Millisecond}})
	n := load(600, 300)
	s.produce(s.newSource(eventgen.SourceConfig{}), n)

	a := s.start("forwarder-a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.InFlight >= 10 }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	inFlight := s.platform.Stats().InFlight
	a.kill9(t)
	killedAt := time.Now()

	holder := a.claimer()
	type orphan struct {
		id    int64
		key   string
		lease time.Time
	}
	rows, err := s.pool.Query(ctx, `SELECT id, message_key, next_retry_at FROM forward_records
		WHERE status = 'IN_PROGRESS' AND claimed_by = $1`, holder)
	if err != nil {
		t.Fatal(err)
	}
	orphans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (orphan, error) {
		var o orphan
		return o, r.Scan(&o.id, &o.key, &o.lease)
	})
	if err != nil {
		t.Fatal(err)
	}
	var other int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_records
		WHERE status = 'IN_PROGRESS' AND claimed_by IS DISTINCT FROM $1`, holder).Scan(&other); err != nil {
		t.Fatal(err)
	}
	if len(orphans) == 0 || other > 0 {
		t.Fatalf("after killing %s with requests in flight: %d rows IN_PROGRESS claimed by it, %d claimed by someone else; want some, and none",
			holder, len(orphans), other)
	}
	t.Logf("killed %s with %d requests in flight at the platform: %d rows left IN_PROGRESS", holder, inFlight, len(orphans))

	// Wait until the platform has seen the dead connections go, so that no
	// request of the dead process is answered after this point.
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.InFlight == 0 }); err != nil {
		t.Fatal(err)
	}
	if err := s.platform.SetFaults(mockplatform.Faults{}); err != nil {
		t.Fatal(err)
	}
	b := s.start("forwarder-b", nil)
	s.waitSettled(3 * time.Minute)
	r := s.verify()

	var reclaims []time.Duration
	for _, o := range orphans {
		var status, claimedBy string
		var reclaimedAt *time.Time
		err := s.pool.QueryRow(ctx, `SELECT r.status, coalesce(r.claimed_by, ''),
			(SELECT min(l.attempted_at) FROM forward_retry_logs l
			 WHERE l.record_id = r.id AND l.result_status = 'LEASE_EXPIRED')
			FROM forward_records r WHERE r.id = $1`, o.id).Scan(&status, &claimedBy, &reclaimedAt)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case status != "SUCCESS":
			t.Errorf("orphaned row %s is %s, want SUCCESS", o.key, status)
		case reclaimedAt == nil:
			t.Errorf("orphaned row %s has no LEASE_EXPIRED attempt log: its lost attempt was not recorded", o.key)
		case reclaimedAt.Before(o.lease):
			t.Errorf("orphaned row %s was claimed again at %s, before its lease ran out at %s",
				o.key, reclaimedAt.Format(time.StampMilli), o.lease.Format(time.StampMilli))
		default:
			reclaims = append(reclaims, reclaimedAt.Sub(killedAt))
		}
		if status == "SUCCESS" && claimedBy != b.claimer() {
			t.Errorf("orphaned row %s was last claimed by %q, want the other instance (pid %d)", o.key, claimedBy, b.Pid())
		}
	}
	t.Logf("%d orphaned rows reclaimed by the other instance; reclaim time after the crash (lease %s): %s",
		len(orphans), s.env["CLAIM_LEASE"], summary(reclaims))
	t.Logf("%s", r)
}

// TestSigtermUnderLoad stops a busy forwarder with SIGTERM: it must exit by
// itself with status 0 (Benthos exits 1 when its shutdown timeout runs out)
// and leave none of its claims IN_PROGRESS (docs/guarantees.md #7). A restarted
// instance then finishes the work: nothing is lost.
func TestSigtermUnderLoad(t *testing.T) {
	scenario(t, heavy, 16*time.Second)
	sigtermUnderLoad(t, nil, 0)
}

// TestSigtermFullQuota is TestSigtermUnderLoad once the forwarder holds most
// of what it may (OUTBOX_MAX_UNACKED, 2400 rows) behind a slow platform, so
// that the stop gives back a full quota of unsent claims, not only what is
// in flight. Ordering is off: with it a forwarder holds one row per berth,
// and the generator's berths are fewer than the quota.
func TestSigtermFullQuota(t *testing.T) {
	scenario(t, heavy, 16*time.Second)
	sigtermUnderLoad(t, map[string]string{"ORDERING": "off"}, min(2_000, load(5_000, 2_000)/2))
}

// sigtermUnderLoad runs a forwarder with env over a slow platform, sends it
// SIGTERM once it has delivered a fifth of the load and holds wantHeld rows
// IN_PROGRESS, and checks the stop and the restart after it.
func sigtermUnderLoad(t *testing.T, env map[string]string, wantHeld int) {
	s := newStack(t, stackOptions{faults: mockplatform.Faults{Latency: 20 * time.Millisecond, LatencyJitter: 200 * time.Millisecond}})
	n := load(5_000, 2_000)
	wait := s.produceAsync(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01, MalformedRate: 0.01}), n)
	a := s.start("forwarder-a", env)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= int64(n/5) && st.InFlight >= 5 }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	var heldAtTerm int
	for {
		counts, err := s.rowCounts(ctx)
		if err != nil {
			t.Fatalf("waiting for %d rows held: %v (%d held then)", wantHeld, err, heldAtTerm)
		}
		if heldAtTerm = counts["IN_PROGRESS"]; heldAtTerm >= wantHeld {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	inFlight := s.platform.Stats().InFlight
	termAt := time.Now()
	a.term(t)
	code, exited := a.waitExit(shutdownTimeout + 20*time.Second)
	took := time.Since(termAt)
	if !exited {
		t.Fatalf("the forwarder was still running %s after SIGTERM (shutdown timeout %s):\n%s", took.Round(time.Millisecond), shutdownTimeout, a.tail(6000))
	}
	if code != 0 {
		t.Errorf("the forwarder exited with status %d after SIGTERM, want 0:\n%s", code, a.tail(6000))
	}
	holder := a.claimer()
	var held, inProgress int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claimed_by = $1), count(*)
		FROM forward_records WHERE status = 'IN_PROGRESS'`, holder).Scan(&held, &inProgress); err != nil {
		t.Fatal(err)
	}
	if held > 0 || inProgress > 0 {
		t.Errorf("after SIGTERM %d rows are still IN_PROGRESS, %d of them claimed by the stopped forwarder %s; want none",
			inProgress, held, holder)
	}
	counts, _ := s.rowCounts(ctx)
	graceful := a.countLines("prevented forced termination") == 0 && a.countLines("Exiting forcefully") == 0
	t.Logf("SIGTERM with %d rows held, %d requests in flight: exit status %d after %s (shutdown timeout %s, graceful %v); rows then %v",
		heldAtTerm, inFlight, code, took.Round(time.Millisecond), shutdownTimeout, graceful, counts)

	if err := wait(); err != nil {
		t.Fatal(err)
	}
	s.start("forwarder-b", env)
	s.waitSettled(3 * time.Minute)
	t.Logf("%s", s.verify())
}

// TestSigtermSaysWhatItWaitsFor stops a forwarder with SIGTERM while its
// requests hang at the platform: Benthos waits for the rows the dispatcher
// handed out before it closes anything (up to three quarters of the
// shutdown timeout), so the log must say, from the moment shutdown begins
// and again while it lasts, what it waits for and how many: an exit that
// takes 20 s is then explained. Once the platform answers, the process
// exits by itself with status 0.
func TestSigtermSaysWhatItWaitsFor(t *testing.T) {
	scenario(t, light, 3*time.Second)
	s := newStack(t, stackOptions{env: map[string]string{
		"FORWARD_TIMEOUT": "20s", "CLAIM_LEASE": "40s", "SHUTDOWN_TIMEOUT": "40s", "ORDERING": "off",
	}})
	s.platform.Hang()
	const n = 6
	s.produce(s.newSource(eventgen.SourceConfig{}), n)
	a := s.start("forwarder", nil)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Hung >= 3 }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	if got := a.countLines("Shutting down"); got != 0 {
		t.Fatalf("shutdown reported before SIGTERM:\n%s", a.tail(4000))
	}
	a.term(t)

	waiting := regexp.MustCompile(`level=info msg="Shutting down: waiting for (\d+) rows? handed out by the dispatcher to be mapped, sent to the platform and recorded[^"]*" .*label=dispatch`)
	var inFlight int
	s.waitUntil("the log to say what shutdown waits for", time.Minute, func(context.Context) (bool, string) {
		m := waiting.FindSubmatch(a.logBytes())
		if m == nil {
			return false, a.tail(2000)
		}
		inFlight, _ = strconv.Atoi(string(m[1]))
		return true, ""
	})
	if held := s.platform.Stats().Hung; inFlight < 3 || int64(inFlight) > n {
		t.Errorf("shutdown waits for %d rows; %d requests hang at the platform, %d messages in all", inFlight, held, n)
	}
	if a.Exited() {
		t.Fatalf("the forwarder exited while its requests were still hanging:\n%s", a.tail(4000))
	}

	s.platform.Release()
	code, exited := a.waitExit(time.Minute)
	if !exited || code != 0 {
		t.Fatalf("after the platform answered: exited %v, status %d; want a clean exit:\n%s", exited, code, a.tail(6000))
	}
	t.Logf("shutdown waited for %d rows in flight:\n%s", inFlight, strings.Join(grepLines(a.logBytes(), "Shutting down", "kafka_franz: committing", "Released"), "\n"))
}

// grepLines are the lines of b holding any of substrs.
func grepLines(b []byte, substrs ...string) []string {
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, s := range substrs {
			if strings.Contains(line, s) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// TestSigtermWhileStarting stops forwarders with SIGTERM while they start,
// with a backlog in Kafka and the outbox: at once when they answer /ping
// (before Benthos listens for SIGTERM), the moment their Kafka input has
// joined the consumer group (Benthos may or may not listen yet), and the
// moment they first claim a row. The forwarder claims nothing before Benthos
// listens, so every time it must exit 0 and leave no row IN_PROGRESS, and
// no member in the consumer group: an exit while starting leaves the group
// as a graceful stop does, so the partitions move on at once. Nothing is
// lost.
func TestSigtermWhileStarting(t *testing.T) {
	scenario(t, light, 15*time.Second)
	s := newStack(t, stackOptions{faults: mockplatform.Faults{Latency: 50 * time.Millisecond}})
	s.produce(s.newSource(eventgen.SourceConfig{}), load(3_000, 1_000))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// inProgress counts the rows IN_PROGRESS, and those claimed by p.
	inProgress := func(p *proc) (all, its int) {
		if err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE claimed_by = $1)
			FROM forward_records WHERE status = 'IN_PROGRESS'`, p.claimer()).Scan(&all, &its); err != nil {
			t.Fatal(err)
		}
		return all, its
	}
	admin := s.kafka.Admin(t)
	for i := range 16 {
		p := s.start(fmt.Sprintf("forwarder-%d", i), nil) // answers /ping before the stream is built
		when := "at /ping"
		if i >= 4 && i < 8 {
			when = "as it joins the consumer group"
			for p.countLines(joinedLine) == 0 {
				if p.Exited() || ctx.Err() != nil {
					t.Fatalf("%s never joined the consumer group (%s):\n%s", p.name, p.state(), p.tail(4000))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		if i >= 8 {
			when = "at the first claim"
			// Polled every few ms: a claimed row stays IN_PROGRESS for the
			// platform's 50 ms at least, and a loaded CI machine needs the
			// CPU more than PostgreSQL needs the queries.
			for _, its := inProgress(p); its == 0; _, its = inProgress(p) {
				if p.Exited() || ctx.Err() != nil {
					t.Fatalf("%s claimed nothing (%s):\n%s", p.name, p.state(), p.tail(4000))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		if err := p.signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, exited := p.waitExit(shutdownTimeout + 20*time.Second)
		if !exited {
			t.Fatalf("%s still running after SIGTERM:\n%s", p.name, p.tail(4000))
		}
		left, _ := inProgress(p)
		gs, err := admin.DescribeGroups(ctx, s.group)
		if err != nil {
			t.Fatal(err)
		}
		members := len(gs[s.group].Members)
		t.Logf("SIGTERM %s: %s, launched %v, %d rows IN_PROGRESS and %d group members after", when, p.state(),
			p.countLines(launchedLine) > 0, left, members)
		if code != 0 || left > 0 || members > 0 {
			t.Errorf("%s stopped %s: %s with %d rows left IN_PROGRESS and %d members in the group; want exit 0 and none left:\n%s",
				p.name, when, p.state(), left, members, p.tail(4000))
		}
	}
	s.start("forwarder", nil)
	s.waitSettled(3 * time.Minute)
	t.Logf("%s", s.verify())
}
