package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// berthEvents is what was produced, per berth: the messageIds of its good
// vehicle events in Kafka order (one berth's events share a camera, hence
// a partition), and when each was handed to the producer.
type berthEvents struct {
	mu       sync.Mutex
	seq      map[string][]string
	produced map[string]time.Time
	berthOf  map[string]string
}

func newBerthEvents() *berthEvents {
	return &berthEvents{seq: map[string][]string{}, produced: map[string]time.Time{}, berthOf: map[string]string{}}
}

// producePaced produces n messages of src at rate messages a second, in
// small synchronous chunks (a berth's events keep their order), recording
// each good vehicle event in be and every message in the stack's
// expectations.
func (s *stack) producePaced(src *eventgen.Source, n, rate int, be *berthEvents) {
	s.t.Helper()
	msgs := make([]eventgen.Message, n)
	for i := range msgs {
		msgs[i] = src.Next()
	}
	s.produceMessagesPaced(msgs, rate, be)
}

// produceMessagesPaced is producePaced of the messages all.
func (s *stack) produceMessagesPaced(all []eventgen.Message, rate int, be *berthEvents) {
	s.t.Helper()
	const tick = 20 * time.Millisecond
	per := max(rate*int(tick)/int(time.Second), 1)
	next := time.Now()
	for len(all) > 0 {
		msgs := all[:min(per, len(all))]
		all = all[len(msgs):]
		recs := make([]*kgo.Record, len(msgs))
		for i, m := range msgs {
			recs[i] = &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}
		}
		at := time.Now()
		if err := s.tryProduceRecords(recs); err != nil {
			s.t.Fatal(err)
		}
		be.mu.Lock()
		for i, m := range msgs {
			s.exp.add(m, recs[i])
			if m.Kind == eventgen.Vehicle && m.Flaw == eventgen.FlawNone {
				be.seq[m.Berth] = append(be.seq[m.Berth], m.MessageID)
				be.produced[m.MessageID] = at
				be.berthOf[m.MessageID] = m.Berth
			}
		}
		be.mu.Unlock()
		next = next.Add(tick)
		time.Sleep(time.Until(next))
	}
}

// orderReport is what checkOrder found.
type orderReport struct {
	berths, events int
	// violations describe a berth event requested before the previous
	// event of its berth had been accepted, or accepted out of order.
	violations []string
	// undelivered counts events never accepted.
	undelivered int
	// healthy are the berths every request of which was accepted (or
	// answered duplicate): no transient failure delayed them.
	healthy map[string]bool
}

// checkOrder reads the platform's per-berth request log against the Kafka
// order: each event of a berth must reach the platform only once the
// previous one was accepted, and acceptances must follow Kafka order. A
// request answered "duplicate" (an event sent again after a crash) is fine
// as long as it is an event already accepted.
func (s *stack) checkOrder(be *berthEvents) orderReport {
	s.t.Helper()
	log := s.platform.BerthLog()
	be.mu.Lock()
	defer be.mu.Unlock()
	r := orderReport{berths: len(be.seq), healthy: map[string]bool{}}
	for berth, want := range be.seq {
		r.events += len(want)
		pos := make(map[string]int, len(want))
		for i, id := range want {
			pos[id] = i
		}
		accepted, healthy := 0, true
		for _, req := range log[berth] {
			i, ours := pos[req.MessageID]
			if !ours {
				continue
			}
			if req.Outcome != mockplatform.OutcomeAccepted && req.Outcome != mockplatform.OutcomeDuplicate {
				healthy = false
			}
			switch {
			case i > accepted:
				r.violations = append(r.violations, fmt.Sprintf("berth %s: event %d (%s) reached the platform (%s) before event %d (%s) was accepted",
					berth, i+1, req.MessageID, req.Outcome, accepted+1, want[accepted]))
			case req.Outcome == mockplatform.OutcomeAccepted && i != accepted:
				r.violations = append(r.violations, fmt.Sprintf("berth %s: event %d (%s) accepted again", berth, i+1, req.MessageID))
			case req.Outcome == mockplatform.OutcomeAccepted:
				accepted++
			}
		}
		r.undelivered += len(want) - accepted
		if healthy {
			r.healthy[berth] = true
		}
	}
	return r
}

// healthyLatency is the p50 and p99 of produce → first acceptance over
// the events of healthy berths whose previous event had been accepted
// before they were produced: events that ordering itself never made wait,
// so that what is left is what other berths cost them.
func (s *stack) healthyLatency(be *berthEvents, healthy map[string]bool) (p50, p99 time.Duration, n int, allP99 time.Duration) {
	be.mu.Lock()
	defer be.mu.Unlock()
	var ds, all []time.Duration
	for berth, ids := range be.seq {
		if !healthy[berth] {
			continue
		}
		var prevAccepted time.Time
		for i, id := range ids {
			d, ok := s.platform.Delivery(id)
			if !ok {
				break
			}
			at := be.produced[id]
			if i == 0 || prevAccepted.Before(at) {
				ds = append(ds, d.FirstAt.Sub(at))
			}
			all = append(all, d.FirstAt.Sub(at))
			prevAccepted = d.FirstAt
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ds)
	slices.Sort(all)
	return ds[len(ds)/2], ds[len(ds)*99/100], len(ds), all[len(all)*99/100]
}

func (r orderReport) assert(t *testing.T) {
	t.Helper()
	if len(r.violations) > 0 {
		shown := r.violations[:min(len(r.violations), 20)]
		t.Errorf("%d ordering violations over %d berths:\n  %s", len(r.violations), r.berths, strings.Join(shown, "\n  "))
	}
	if r.undelivered > 0 {
		t.Errorf("%d of %d berth events never accepted", r.undelivered, r.events)
	}
}

// TestOrderingPerBerth: enter/exit pairs of 5 000 berths, produced at a
// steady rate to three instances, with a platform that takes 20–60 ms per
// request and fails a fifth of first attempts transiently (errcode 999,
// retried after FORWARD_RETRY_INITIAL). Every berth's events reach the
// platform in Kafka order, one at a time: the platform never has two
// requests of one berth in flight at once (it counts, per berth, the
// requests it is handling when one arrives). The same load also runs with
// ORDERING=off (first: it warms the shared PostgreSQL up), where the
// platform must see some berth's requests overlap, or the check above
// could not see them either; and the latency of the berths no failure
// touched is logged for both, for the events their own berth did not hold
// back: a failing berth holds back only itself (no assertion on time: the
// figures are for the reader).
func TestOrderingPerBerth(t *testing.T) {
	scenario(t, heavy, 30*time.Second)
	berths := load(5_000, 1_000)
	n := berths * 5 / 2 // a pair per berth, and heartbeats (1 in 5)
	const rate = 1_000
	type result struct {
		p50, p99 time.Duration
		// allP99 counts the events held behind their own berth's previous
		// event too.
		allP99   time.Duration
		measured int
		healthy  int
		report   orderReport
		// overlaps are the berths the platform had more than one request
		// of in flight at once, with how many at most.
		overlaps map[string]int
	}
	run := func(t *testing.T, ordering string) result {
		s := newStack(t, stackOptions{
			env:    map[string]string{"ORDERING": ordering, "CLAIM_LEASE": "20s"},
			faults: mockplatform.Faults{FirstTry999: 0.2, Latency: 20 * time.Millisecond, LatencyJitter: 40 * time.Millisecond},
		})
		src := s.newSource(eventgen.SourceConfig{Berths: berths})
		s.startAll("forwarder-a", "forwarder-b", "forwarder-c")
		be := newBerthEvents()
		s.producePaced(src, n, rate, be)
		s.waitSettled(4 * time.Minute)
		r := s.verify()
		or := s.checkOrder(be)
		var res result
		res.report = or
		res.p50, res.p99, res.measured, res.allP99 = s.healthyLatency(be, or.healthy)
		res.healthy = len(or.healthy)
		peaks := s.platform.BerthInFlightPeaks()
		res.overlaps = map[string]int{}
		for berth, peak := range peaks {
			if peak > 1 {
				res.overlaps[berth] = peak
			}
		}
		if len(peaks) < or.berths {
			t.Errorf("the platform counted requests in flight for %d berths, %d were produced", len(peaks), or.berths)
		}
		t.Logf("ORDERING=%s: %d berths, %d events in Kafka order checked, %d violations, %d berths with requests in flight at once; healthy berths %d, their p50 %s p99 %s (n=%d); %s",
			ordering, or.berths, or.events, len(or.violations), len(res.overlaps), res.healthy, res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond), res.measured, r)
		return res
	}

	var on, off result
	// Off first: the first run also warms the shared PostgreSQL up, which
	// would count against ordering otherwise.
	t.Run("off", func(t *testing.T) {
		off = run(t, "off")
		// Without ordering an exit may overtake its enter: that is what the
		// feature is for. Count it, for the reader.
		t.Logf("ORDERING=off: %d berth events reached the platform before their predecessor was accepted", len(off.report.violations))
		// The control: the same load without ordering does put requests
		// of one berth in flight together, so that the check of the
		// ordered run below can see it.
		if len(off.overlaps) == 0 {
			t.Errorf("ORDERING=off: no berth ever had two requests in flight at once: the load cannot show whether ordering keeps them apart")
		}
	})
	t.Run("berth", func(t *testing.T) {
		on = run(t, "berth")
		on.report.assert(t)
		if len(on.overlaps) > 0 {
			var shown []string
			for berth, peak := range on.overlaps {
				if len(shown) < 10 {
					shown = append(shown, fmt.Sprintf("%s: %d", berth, peak))
				}
			}
			slices.Sort(shown)
			t.Errorf("%d berths had more than one request in flight at once at the platform (ORDERING=berth, three instances), e.g. %s",
				len(on.overlaps), strings.Join(shown, ", "))
		}
	})
	t.Logf("produce→platform latency at %d messages/s of the healthy berths' events that no earlier event of their own berth held back: "+
		"p99 ordering on %s, off %s; p50 %s vs %s (%d and %d healthy berths). Counting also the events held behind their own berth's previous one: p99 %s vs %s",
		rate, on.p99.Round(time.Millisecond), off.p99.Round(time.Millisecond), on.p50.Round(time.Millisecond), off.p50.Round(time.Millisecond),
		on.healthy, off.healthy, on.allP99.Round(time.Millisecond), off.allP99.Round(time.Millisecond))
}

// TestOrderingFailedHead: a berth's enter event is refused for good by the
// platform (errcode 998). With ORDER_ON_FAILED=skip its exit goes next,
// and its attempt log says why; with block the exit waits, while other
// berths flow, until `forwarder outbox requeue --key` sends the enter again
// (then the exit follows), or `forwarder outbox release` gives up on it.
func TestOrderingFailedHead(t *testing.T) {
	t.Parallel()
	berth := func(code string) func(m map[string]any) {
		return func(m map[string]any) {
			m["berthCode"] = code
		}
	}
	exit := func(code string) func(m map[string]any) {
		return func(m map[string]any) {
			m["berthCode"] = code
			m["inoutType"] = 0
		}
	}
	// produce writes, per berth, an enter then an exit (one partition: the
	// camera is the Kafka key).
	produce := func(s *stack, codes ...string) {
		var recs []*kgo.Record
		for _, c := range codes {
			for _, ev := range []struct {
				id   string
				edit func(map[string]any)
			}{{"enter-" + c, berth(c)}, {"exit-" + c, exit(c)}} {
				recs = append(recs, &kgo.Record{Topic: topicVehicle, Key: []byte("CAM-0001"), Value: vehicleJSON(ev.id, ev.edit)})
				s.exp.addGood(ev.id)
			}
		}
		s.produceRecords(recs...)
	}
	status := func(s *stack, key string) (st string, held, blocked bool, logs []string) {
		ctx := context.Background()
		if err := s.pool.QueryRow(ctx, `SELECT status, order_held, order_blocked FROM forward_records WHERE message_key = $1`, key).
			Scan(&st, &held, &blocked); err != nil {
			s.t.Fatalf("row %s: %v", key, err)
		}
		rows, err := s.pool.Query(ctx, `SELECT result_status || coalesce(': ' || error_message, '') FROM forward_retry_logs l
			JOIN forward_records r ON r.id = l.record_id WHERE r.message_key = $1 ORDER BY l.id`, key)
		if err != nil {
			s.t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				s.t.Fatal(err)
			}
			logs = append(logs, l)
		}
		return st, held, blocked, logs
	}
	requests := func(s *stack, id string) int {
		n := 0
		for _, reqs := range s.platform.BerthLog() {
			for _, r := range reqs {
				if r.MessageID == id {
					n++
				}
			}
		}
		return n
	}
	waitStatus := func(s *stack, key, want string) {
		s.waitUntil(key+" "+want, time.Minute, func(ctx context.Context) (bool, string) {
			var st string
			err := s.pool.QueryRow(ctx, `SELECT status FROM forward_records WHERE message_key = $1`, key).Scan(&st)
			return err == nil && st == want, fmt.Sprintf("%s is %q (%v)", key, st, err)
		})
	}
	cli := func(s *stack, args ...string) string {
		cmd := exec.Command(forwarderBin, append([]string{"outbox"}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+s.dsn)
		out, err := cmd.CombinedOutput()
		if err != nil {
			s.t.Fatalf("forwarder outbox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	t.Run("SkipReleasesTheNext", func(t *testing.T) {
		scenario(t, light, 5*time.Second)
		s := newStack(t, stackOptions{env: map[string]string{"ORDER_ON_FAILED": "skip"}})
		s.platform.Reject("enter-B-001")
		s.start("forwarder", nil)
		produce(s, "B-001", "B-002")
		s.waitUntil("every row finished", time.Minute, func(ctx context.Context) (bool, string) {
			c, err := s.rowCounts(ctx)
			return err == nil && c["SUCCESS"] == 3 && c["FAILED"] == 1, fmt.Sprint(c)
		})
		if st, _, blocked, _ := status(s, "enter-B-001"); st != "FAILED" || blocked {
			t.Errorf("the rejected enter is %s, blocking %v; want FAILED, not blocking", st, blocked)
		}
		_, _, _, logs := status(s, "exit-B-001")
		if len(logs) < 2 || !strings.HasPrefix(logs[0], "ORDER_RELEASED") || !strings.Contains(logs[0], "998") {
			t.Errorf("the exit's attempt log %q does not start with the skip that released it", logs)
		}
		or := s.platform.BerthLog()["P1001/B-001"]
		if len(or) != 2 || or[0].MessageID != "enter-B-001" || or[0].Outcome != mockplatform.OutcomeRejected ||
			or[1].MessageID != "exit-B-001" || or[1].Outcome != mockplatform.OutcomeAccepted {
			t.Errorf("the platform saw berth B-001 as %+v, want the rejected enter, then the exit", or)
		}
	})

	t.Run("BlockHoldsUntilRequeueOrRelease", func(t *testing.T) {
		scenario(t, light, 8*time.Second)
		s := newStack(t, stackOptions{env: map[string]string{"ORDER_ON_FAILED": "block"}})
		s.platform.Reject("enter-B-001", "enter-B-003")
		s.start("forwarder", nil)
		produce(s, "B-001", "B-002", "B-003")
		waitStatus(s, "exit-B-002", "SUCCESS")
		waitStatus(s, "enter-B-001", "FAILED")
		waitStatus(s, "enter-B-003", "FAILED")
		// Long enough for a released exit to have been sent: the other
		// berth went through in less.
		time.Sleep(2 * time.Second)
		for _, b := range []string{"B-001", "B-003"} {
			if st, _, blocked, _ := status(s, "enter-"+b); st != "FAILED" || !blocked {
				t.Errorf("enter-%s is %s, blocking %v; want FAILED and blocking", b, st, blocked)
			}
			if st, held, _, _ := status(s, "exit-"+b); st != "PENDING" || !held || requests(s, "exit-"+b) != 0 {
				t.Errorf("exit-%s is %s, held %v, sent %d times; want held, never sent", b, st, held, requests(s, "exit-"+b))
			}
		}
		stats := cli(s, "stats")
		if !strings.Contains(stats, "2 keys blocked") || !strings.Contains(stats, "P1001/B-001") {
			t.Errorf("outbox stats does not show the blocked berths:\n%s", stats)
		}

		// Requeue: the enter goes again, first; the exit after it.
		s.platform.Accept("enter-B-001")
		// Refused for good (998): a requeue must ask for it.
		if out := cli(s, "requeue", "--key", "enter-B-001", "--include-rejected"); !strings.Contains(out, "1 row requeued") {
			t.Fatalf("outbox requeue said:\n%s", out)
		}
		waitStatus(s, "exit-B-001", "SUCCESS")
		or := s.platform.BerthLog()["P1001/B-001"]
		if len(or) < 3 || or[len(or)-2].MessageID != "enter-B-001" || or[len(or)-2].Outcome != mockplatform.OutcomeAccepted ||
			or[len(or)-1].MessageID != "exit-B-001" {
			t.Errorf("after the requeue the platform saw berth B-001 as %+v, want the enter accepted, then the exit", or)
		}

		// Release: the enter stays FAILED, the exit goes.
		out := cli(s, "release", "--key", "P1001/B-003", "--operator", "e2e")
		if !strings.Contains(out, "is due now") {
			t.Errorf("outbox release said:\n%s", out)
		}
		waitStatus(s, "exit-B-003", "SUCCESS")
		if st, _, blocked, _ := status(s, "enter-B-003"); st != "FAILED" || blocked {
			t.Errorf("the released enter is %s, blocking %v; want FAILED, not blocking", st, blocked)
		}
		if _, _, _, logs := status(s, "exit-B-003"); len(logs) == 0 || !strings.Contains(logs[0], "released by operator e2e") {
			t.Errorf("the exit's attempt log %q does not name the release", logs)
		}
	})
}

// TestOrderingThroughCrashes: berth pairs on three instances, one of them
// killed with SIGKILL mid-sequence and restarted, and PostgreSQL crashed
// (immediate stop) and started again, with a platform that fails some
// first attempts: every berth's events still reach the platform in Kafka
// order, nothing is lost, and no event is accepted twice or reaches the
// platform before its predecessor was accepted (events sent again after a
// crash are answered "duplicate", which the order check allows for events
// already accepted).
func TestOrderingThroughCrashes(t *testing.T) {
	scenario(t, heavy, 25*time.Second)
	pg := pgtest.StartCluster(t)
	s := newStack(t, stackOptions{cluster: pg, faults: mockplatform.Faults{FirstTry999: 0.1, Latency: 2 * time.Millisecond, LatencyJitter: 20 * time.Millisecond}})
	berths := load(2_000, 500)
	n := berths * 5 / 2
	src := s.newSource(eventgen.SourceConfig{Berths: berths, DuplicateRate: 0.01})
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = s.start(fmt.Sprintf("forwarder-%c", 'a'+i), nil)
	}
	be := newBerthEvents()
	var produced sync.WaitGroup
	produced.Add(1)
	go func() {
		defer produced.Done()
		s.producePaced(src, n, 500, be)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= int64(n/4) }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	procs[1].kill9(t)
	t.Logf("killed %s at %+v", procs[1].name, s.platform.Stats())
	procs[1] = s.start("forwarder-b2", nil)

	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= int64(n/2) }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	if err := pg.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	downAt := time.Now()
	time.Sleep(3 * time.Second)
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL crashed and restarted after %s, at %+v", time.Since(downAt).Round(time.Millisecond), s.platform.Stats())

	produced.Wait()
	s.waitSettled(4 * time.Minute)
	r := s.verify()
	or := s.checkOrder(be)
	or.assert(t)
	t.Logf("%d berths, %d events checked in Kafka order, %d violations, %d events sent again after a crash (answered duplicate); %s",
		or.berths, or.events, len(or.violations), r.dupMessages, r)
}
