package e2e_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// TestPauseDelivery: an operator pauses delivery under load with two
// instances (docs/operations.md, "Planned maintenance"). From the time every
// instance has read the pause (each reads the shared state every second)
// and the requests already in flight have ended, the platform gets no
// request at all, not even from an instance restarted during the pause,
// while Kafka is still consumed into PENDING rows and both instances report
// forwarder_delivery_paused 1. After `outbox resume` each instance's
// concurrency limit ramps up from one, as after an outage; a second pause,
// with --until, ends by itself. Every message is delivered at its first
// attempt (the pauses spent none), and once, unless its attempt log shows a
// lease that ran out.
func TestPauseDelivery(t *testing.T) {
	scenario(t, quiet, 40*time.Second)
	env := merged(shortAttempts, map[string]string{
		"FORWARD_MAX_IN_FLIGHT": strconv.Itoa(outageMaxInFlight),
		"FORWARD_TIMEOUT":       outageTimeout.String(),
	})
	s := newStack(t, stackOptions{env: env, faults: mockplatform.Faults{Latency: outageLatency, LatencyJitter: 20 * time.Millisecond}})
	src := s.newSource(eventgen.SourceConfig{})
	procs := []*proc{s.start("fwd-a", nil), s.start("fwd-b", nil)}
	stopLoad := s.steadyLoad(src, 100)
	defer stopLoad()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= 100 }); err != nil {
		t.Fatal(err)
	}
	outbox := func(args ...string) string {
		t.Helper()
		out, err := runForwarder(t, s.env, append([]string{"outbox"}, args...)...)
		if err != nil {
			t.Fatalf("outbox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	rows := func() int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM forward_messages").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	outbox("pause", "--reason", "platform maintenance", "--operator", "e2e")
	time.Sleep(outageSettle)
	sent, stored := s.platform.Stats().Requests, rows()
	watchFrom := time.Now()
	for _, p := range procs {
		m := mustScrape(t, ctx, p)
		if v := m.require(t, "forwarder_delivery_paused", nil); v != 1 {
			t.Errorf("%s: forwarder_delivery_paused = %v during the pause, want 1", p.name, v)
		}
		if v := m.require(t, "forwarder_delivery_pause_end_timestamp_seconds", nil); v != 0 {
			t.Errorf("%s: forwarder_delivery_pause_end_timestamp_seconds = %v for a pause until resumed, want 0", p.name, v)
		}
		if v := m.require(t, "forwarder_delivery_pause_started_timestamp_seconds", nil); v < float64(watchFrom.Add(-time.Minute).Unix()) {
			t.Errorf("%s: forwarder_delivery_pause_started_timestamp_seconds = %v", p.name, v)
		}
	}
	// An instance restarted during the pause sends nothing either.
	procs[1].term(t)
	procs[1] = s.start("fwd-b2", nil)
	time.Sleep(time.Until(watchFrom.Add(outageWatch)))
	during, watched := s.platform.Stats().Requests-sent, time.Since(watchFrom)
	if during != 0 {
		t.Errorf("%d requests reached the platform in %v of a pause", during, watched.Round(time.Millisecond))
	}
	if got := rows(); got <= stored {
		t.Errorf("%d messages stored before %v of the pause, %d after: Kafka was not consumed while paused", stored, watched.Round(time.Millisecond), got)
	}
	if stats := outbox("stats"); !strings.Contains(stats, "delivery: PAUSED by e2e for ") || !strings.Contains(stats, "platform maintenance") {
		t.Errorf("outbox stats during the pause:\n%s", stats)
	}

	// Resume: each instance's limit starts again from one.
	samplers := make([]func() []gateSample, len(procs))
	for i, p := range procs {
		samplers[i] = sampleGate(p)
	}
	time.Sleep(300 * time.Millisecond) // a few samples of the pause first
	resumeFrom := s.platform.Stats().Requests
	outbox("resume", "--operator", "e2e")
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Requests > resumeFrom+50 }); err != nil {
		t.Fatalf("delivery did not resume: %v", err)
	}
	time.Sleep(3 * time.Second)
	var (
		ramps []string
		steps int
	)
	for i, stop := range samplers {
		seen, n := checkRamp(t, procs[i].name, stop(), func(s gateSample) bool { return s.paused == 1 })
		ramps = append(ramps, procs[i].name+": "+seen)
		steps = max(steps, n)
	}
	if steps < 2 {
		t.Errorf("no instance's limit took two values between 1 and %d after the resume (%s): no ramp seen", outageMaxInFlight, strings.Join(ramps, "; "))
	}

	// A pause with an end ends by itself.
	outbox("pause", "--until", "6s", "--operator", "e2e")
	endsAt := time.Now().Add(6 * time.Second)
	time.Sleep(outageSettle)
	sent = s.platform.Stats().Requests
	time.Sleep(time.Until(endsAt.Add(-500 * time.Millisecond)))
	if n := s.platform.Stats().Requests - sent; n != 0 {
		t.Errorf("%d requests during a pause with --until", n)
	}
	untilFrom := s.platform.Stats().Requests
	ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
	defer ecancel()
	if err := s.platform.WaitFor(ectx, func(st mockplatform.Stats) bool { return st.Requests > untilFrom }); err != nil {
		t.Errorf("no request within 5s of the end of a pause with --until: %v", err)
	}

	stopLoad()
	s.waitSettled(2 * time.Minute)
	r := s.verify()
	// As in TestOutageFailsNothing: only where the attempt log says why.
	if r.unexplainedDups != 0 {
		t.Errorf("%d deliveries of %d messages delivered twice have no lost lease or unanswered request to explain them:%s",
			r.unexplainedDups, r.dupMessages, s.dupHistory(r))
	}
	if r.maxAttempts != 1 {
		t.Errorf("a message took %d attempts: a pause spent one", r.maxAttempts)
	}
	t.Logf("pause: %d requests in %v; limits after the resume (time since, limit): %s; %s",
		during, watched.Round(time.Millisecond), strings.Join(ramps, "; "), r)
}
