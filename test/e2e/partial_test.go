package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// The shipped retry schedule (docs/configuration.md), which the partial
// failure scenarios run with.
var shippedRetries = map[string]string{
	"FORWARD_RETRY_INITIAL":   "5s",
	"FORWARD_RETRY_MAX":       "300s",
	"PLATFORM_PROBE_INTERVAL": "5s",
}

// breakerWatch samples the shared breaker state until stopped, and says
// every state it saw.
func (s *stack) breakerWatch() (stop func() []string) {
	var (
		mu   sync.Mutex
		seen []string
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var st string
			err := s.pool.QueryRow(ctx, "SELECT breaker_state FROM forward_platform_state").Scan(&st)
			cancel()
			if err == nil {
				mu.Lock()
				if !slices.Contains(seen, st) {
					seen = append(seen, st)
				}
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() []string {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// assertNeverOpened fails unless the breaker stayed CLOSED all along: in
// the shared state sampled by watch, in every instance's log, and in the
// probes counted (none is sent while it is closed).
func (s *stack) assertNeverOpened(seen []string, procs []*proc) {
	s.t.Helper()
	if len(seen) != 1 || seen[0] != "CLOSED" {
		s.t.Errorf("the shared breaker went through %v; a platform that answers other messages is up, it must stay CLOSED", seen)
	}
	for _, p := range procs {
		if n := p.countLines("circuit breaker", "-> OPEN"); n > 0 {
			s.t.Errorf("%s opened its breaker %d times", p.name, n)
		}
		// Every result's series counts (the counter has one per result,
		// made by its first probe: none at all reads as 0); a page that
		// cannot be read fails the test rather than reading as no probe.
		if probes := mustScrape(s.t, context.Background(), p).sum("forwarder_platform_probes_total"); probes != 0 {
			s.t.Errorf("%s sent %v probes", p.name, probes)
		}
	}
}

// withinShare is the share of msgs accepted by the platform within limit of
// being produced.
func (s *stack) withinShare(produced map[string]time.Time, limit time.Duration) (share float64, late []string) {
	in := 0
	for id, at := range produced {
		d, ok := s.platform.Delivery(id)
		if ok && d.FirstAt.Sub(at) <= limit {
			in++
			continue
		}
		if len(late) < 10 {
			late = append(late, fmt.Sprintf("%s (%v)", id, d.FirstAt.Sub(at).Round(time.Millisecond)))
		}
	}
	return float64(in) / float64(max(len(produced), 1)), late
}

// TestPartialPlatformFailures: a platform that fails some messages is not an
// outage (docs/guarantees.md #13). Those messages retry on their own
// schedule, spend their attempts and end FAILED with the reason; the
// breaker stays closed and the others flow. With ordering on (the default),
// one instance and three.
func TestPartialPlatformFailures(t *testing.T) {
	t.Parallel()
	// A quiet moment: six vehicle events the platform always answers HTTP
	// 500, and nothing else. Five distinct messages failing with nothing
	// answered look like an outage, so the breaker opens and they keep their
	// attempts. Six more such events come while it is open: each carries a
	// probe, which fails and counts no attempt. The next new message then
	// carries the next probe, not the six (which would otherwise come first,
	// having waited longer with as few attempts), and is delivered. A failure
	// counts only while other messages are answered (else it may be an
	// outage): when traffic comes back, the twelve spend their attempts and
	// end FAILED with the reason.
	t.Run("AQuietMomentOpensItTheNextNewMessageClosesIt", func(t *testing.T) {
		scenario(t, light, 60*time.Second)
		// Probes every second, so that the probes of the second six take
		// seconds, not half a minute.
		s := newStack(t, stackOptions{env: merged(shippedRetries, map[string]string{"FORWARD_MAX_ATTEMPTS": "4", "PLATFORM_PROBE_INTERVAL": "1s"})})
		s.start("forwarder-1", nil)
		failing := func(wave string) []string {
			var recs []*kgo.Record
			var ids []string
			for i := range 6 {
				id := fmt.Sprintf("always-fails-%s-%d", wave, i+1)
				ids = append(ids, id)
				recs = append(recs, &kgo.Record{Topic: topicVehicle, Key: []byte(id),
					Value: vehicleJSON(id, func(m map[string]any) { m["berthCode"] = id })})
			}
			s.platform.Fail(-1, ids...)
			s.produceRecords(recs...)
			for i, r := range recs {
				s.exp.addBad(badMsg{at: coord{r.Topic, r.Partition, r.Offset}, messageID: ids[i], reason: "giving up after 4 attempts: http 500"})
			}
			return ids
		}
		failing("a")
		s.waitUntil("the breaker OPEN", 30*time.Second, func(ctx context.Context) (bool, string) {
			st := s.breakerState(ctx)
			return st == "OPEN", "breaker " + st
		})
		probed := failing("b")
		s.waitUntil("a failed probe with each of the second six", 30*time.Second, func(ctx context.Context) (bool, string) {
			var n int
			if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE message_key = ANY($1)
					AND attempt_count = 0 AND last_error LIKE 'platform unavailable, attempt not counted%'`, probed).Scan(&n); err != nil {
				return false, err.Error()
			}
			return n == len(probed), fmt.Sprintf("%d of %d probed", n, len(probed))
		})

		good := &kgo.Record{Topic: topicVehicle, Key: []byte("CAM-GOOD"),
			Value: vehicleJSON("new-after-the-opening", func(m map[string]any) { m["berthCode"] = "GOOD-1" })}
		s.produceRecords(good)
		s.exp.addGood("new-after-the-opening")
		s.waitUntil("the new message delivered", 30*time.Second, func(context.Context) (bool, string) {
			_, ok := s.platform.Delivery("new-after-the-opening")
			return ok, fmt.Sprintf("platform %+v", s.platform.Stats())
		})
		// Between the new message's row and its delivery, at most the probe
		// already claimed when it came went out with one of the six.
		var between int
		if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM forward_retry_logs l JOIN forward_records r ON r.id = l.record_id
				WHERE r.message_key = ANY($1)
				  AND l.attempted_at > (SELECT created_at FROM forward_records WHERE message_key = 'new-after-the-opening')
				  AND l.attempted_at < (SELECT attempted_at FROM forward_retry_logs l2 JOIN forward_records r2 ON r2.id = l2.record_id
				                        WHERE r2.message_key = 'new-after-the-opening' AND l2.result_status = 'SUCCESS')`, probed).Scan(&between); err != nil {
			t.Fatal(err)
		}
		if between > 1 {
			t.Errorf("%d probes went out with the second six between the new message's arrival and its delivery, want at most 1: %q",
				between, s.attemptsOf(context.Background(), "PENDING", 12))
		}
		// Traffic comes back (heartbeats, other berths): with other
		// messages answered, each failure of the twelve is theirs and counts.
		stop := s.steadyLoad(s.newSource(eventgen.SourceConfig{Berths: 50}), 10)
		s.waitUntil("the twelve FAILED", 2*time.Minute, func(ctx context.Context) (bool, string) {
			n := s.countStatus(ctx, "FAILED")
			return n == 12, fmt.Sprintf("%d FAILED", n)
		})
		stop()
		s.waitSettled(2 * time.Minute)
		r := s.verify()
		t.Logf("%d probes with the second six while the new message waited; %s", between, r)
	})

	for _, instances := range []int{1, 3} {
		// A quiet night: three vehicle events the platform answers HTTP 500
		// every time, alone for their first two attempts, then ordinary
		// traffic at 5 messages a second on other berths for 60 s.
		t.Run(fmt.Sprintf("QuietNight/%dInstances", instances), func(t *testing.T) {
			scenario(t, light, 74*time.Second)
			s := newStack(t, stackOptions{env: merged(shippedRetries, map[string]string{"FORWARD_MAX_ATTEMPTS": "4"})})
			var procs []*proc
			for i := range instances {
				procs = append(procs, s.start(fmt.Sprintf("forwarder-%d", i+1), nil))
			}
			watch := s.breakerWatch()

			var bad []*kgo.Record
			var badIDs []string
			for i := range 3 {
				id := fmt.Sprintf("cannot-handle-%d", i+1)
				badIDs = append(badIDs, id)
				bad = append(bad, &kgo.Record{Topic: topicVehicle, Key: []byte(fmt.Sprintf("CAM-BAD-%d", i)),
					Value: vehicleJSON(id, func(m map[string]any) { m["berthCode"] = fmt.Sprintf("BAD-%d", i) })})
			}
			s.platform.Fail(-1, badIDs...)
			s.produceRecords(bad...)
			badAt := time.Now()
			for i, r := range bad {
				s.exp.addBad(badMsg{at: coord{r.Topic, r.Partition, r.Offset}, messageID: badIDs[i], reason: "giving up after 4 attempts: http 500"})
			}

			// The night is quiet: the three fail twice before anything else
			// comes (the second round of three failures in a row is what
			// opened the breaker when it judged replies, not messages).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.HTTP5xx >= 6 }); err != nil {
				t.Fatal(err)
			}

			src := s.newSource(eventgen.SourceConfig{Berths: 500})
			produced := map[string]time.Time{}
			next := time.Now()
			for range 300 { // 5 a second for 60 s
				m := src.Next()
				rec := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}
				s.produceRecords(rec)
				s.exp.add(m, rec)
				if m.Deliverable() {
					produced[m.MessageID] = time.Now()
				}
				next = next.Add(200 * time.Millisecond)
				time.Sleep(time.Until(next))
			}
			s.waitSettled(time.Minute)
			seen := watch()
			r := s.verify()

			share, late := s.withinShare(produced, 10*time.Second)
			if share < 0.95 {
				t.Errorf("%.1f%% of %d ordinary messages reached the platform within 10 s of being produced, want at least 95%% (late: %s)",
					100*share, len(produced), strings.Join(late, ", "))
			}
			// Four attempts, then FAILED with the reason.
			var failedIn []time.Duration
			for _, id := range badIDs {
				var attempts int
				var failedAt time.Time
				var lastErr string
				if err := s.pool.QueryRow(context.Background(), `SELECT attempt_count, failed_at, last_error FROM forward_records WHERE message_key = $1 AND status = 'FAILED'`, id).
					Scan(&attempts, &failedAt, &lastErr); err != nil {
					t.Fatalf("%s is not FAILED: %v", id, err)
				}
				failedIn = append(failedIn, failedAt.Sub(badAt).Round(time.Second))
				if attempts != 4 || !strings.Contains(lastErr, "http 500") {
					t.Errorf("%s FAILED after %d attempts (%q), want 4 and the reason", id, attempts, lastErr)
				}
				// 5 s, 10 s and 20 s apart, ±10 %: 38.5 s at most, and a
				// little for the claims.
				if d := failedAt.Sub(badAt); d > 45*time.Second {
					t.Errorf("%s FAILED %v after it was produced, want within its retry schedule (35 s ± 10 %%)", id, d.Round(time.Second))
				}
			}
			s.assertNeverOpened(seen, procs)
			t.Logf("%d instance(s): %.1f%% of %d ordinary messages within 10 s; the 3 failing messages FAILED after %v; breaker states %v; %s",
				instances, 100*share, len(produced), failedIn, seen, r)
		})

		// A platform that fails some messages for a while: 300 berths × 4
		// vehicle events; every third event is answered HTTP 500 twice, then
		// accepted.
		t.Run(fmt.Sprintf("SomeMessagesFailForAWhile/%dInstances", instances), func(t *testing.T) {
			// Three instances at 200 messages a second keep the CPU busy.
			seat := light
			if instances > 1 {
				seat = heavy
			}
			scenario(t, seat, 67*time.Second)
			s := newStack(t, stackOptions{env: shippedRetries})
			var procs []*proc
			for i := range instances {
				procs = append(procs, s.start(fmt.Sprintf("forwarder-%d", i+1), nil))
			}
			watch := s.breakerWatch()

			src := s.newSource(eventgen.SourceConfig{Berths: 300})
			var msgs []eventgen.Message
			var failing []string
			vehicles := 0
			for vehicles < 1200 {
				m := src.Next()
				msgs = append(msgs, m)
				if m.Kind == eventgen.Vehicle && m.Deliverable() {
					if vehicles++; vehicles%3 == 0 {
						failing = append(failing, m.MessageID)
					}
				}
			}
			s.platform.Fail(2, failing...)
			be := newBerthEvents()
			s.produceMessagesPaced(msgs, 200, be)
			s.waitSettled(2 * time.Minute)
			seen := watch()
			r := s.verify()
			or := s.checkOrder(be)
			or.assert(t)
			failingSet := map[string]bool{}
			for _, id := range failing {
				failingSet[id] = true
			}
			// The events that never failed, and whose berth did not hold them
			// behind one that did, must not have been slowed.
			others := map[string]time.Time{}
			be.mu.Lock()
			for _, ids := range be.seq {
				for _, id := range ids {
					if failingSet[id] {
						break
					}
					others[id] = be.produced[id]
				}
			}
			be.mu.Unlock()
			share, late := s.withinShare(others, 10*time.Second)
			if share < 0.95 {
				t.Errorf("%.1f%% of %d events not held behind a failing one reached the platform within 10 s, want at least 95%% (late: %s)",
					100*share, len(others), strings.Join(late, ", "))
			}
			s.assertNeverOpened(seen, procs)
			t.Logf("%d instance(s): %d of %d vehicle events failed twice first; %.1f%% of the %d others within 10 s; breaker states %v; order: %d berths, %d violations; %s",
				instances, len(failing), vehicles, 100*share, len(others), seen, or.berths, len(or.violations), r)
		})
	}
}
