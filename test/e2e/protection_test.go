package e2e_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/tcpproxy"
)

// Settings that make a row's attempts short: three attempts within about a
// second, so that an outage of ten times that shows whether attempts are
// burnt while the platform is down.
var shortAttempts = map[string]string{
	"FORWARD_RETRY_INITIAL":   "100ms",
	"FORWARD_RETRY_MAX":       "400ms",
	"FORWARD_MAX_ATTEMPTS":    "3",
	"FORWARD_TIMEOUT":         "500ms",
	"CLAIM_LEASE":             "2s",
	"PLATFORM_PROBE_INTERVAL": "1s",
	"FAILED_REQUEUE_AFTER":    "0s",
}

func (s *stack) breakerState(ctx context.Context) string {
	var state string
	if err := s.pool.QueryRow(ctx, "SELECT breaker_state FROM forward_platform_state").Scan(&state); err != nil {
		s.t.Fatal(err)
	}
	return state
}

// attemptsOf describes the attempt logs of up to n rows with status, for a
// failure to say what happened to them.
func (s *stack) attemptsOf(ctx context.Context, status string, n int) []string {
	rows, err := s.pool.Query(ctx, `SELECT r.message_key, r.attempt_count, coalesce(r.last_error, ''), r.updated_at,
			coalesce(l.attempt_number, 0), coalesce(l.result_status, '(no attempt log)'), coalesce(l.http_status, 0),
			coalesce(l.error_message, ''), coalesce(l.attempted_at, r.updated_at)
		FROM forward_records r LEFT JOIN forward_retry_logs l ON l.record_id = r.id
		WHERE r.id IN (SELECT id FROM forward_records WHERE status = $1 ORDER BY id LIMIT $2)
		ORDER BY r.id, l.id`, status, n)
	if err != nil {
		return []string{err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var key, lastErr, result, msg string
		var attempts, number, code int
		var updated, at time.Time
		if err := rows.Scan(&key, &attempts, &lastErr, &updated, &number, &result, &code, &msg, &at); err != nil {
			return append(out, err.Error())
		}
		out = append(out, fmt.Sprintf("%s (%d attempts, last error %q, updated %s): attempt %d at %s: %s (HTTP %d) %q",
			key, attempts, lastErr, updated.Format(time.StampMilli), number, at.Format(time.StampMilli), result, code, msg))
	}
	if err := rows.Err(); err != nil {
		out = append(out, err.Error())
	}
	return out
}

func (s *stack) countStatus(ctx context.Context, status string) int {
	c, err := s.rowCounts(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return c[status]
}

// steadyLoad produces rate messages a second until stop is called.
func (s *stack) steadyLoad(src *eventgen.Source, rate int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := s.tryProduce(src, max(rate/10, 1)); err != nil {
					s.t.Errorf("producing: %v", err)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// The outage scenario's numbers (TestOutageFailsNothing).
const (
	// outageMaxInFlight is FORWARD_MAX_IN_FLIGHT of each instance.
	outageMaxInFlight = 20
	// outageLatency is the platform's least reply time: the round trip of
	// the ramp's bound (docs/architecture.md, Protecting the platform).
	outageLatency = 100 * time.Millisecond
	// outageTimeout is FORWARD_TIMEOUT: ten times the platform's latency,
	// as shortAttempts's 500ms is twenty-five times the 20ms of the other
	// scenarios.
	outageTimeout = time.Second
	// outageSettle is how long after the breaker opened every instance has
	// stopped sending: its next read of the shared state (each second) plus
	// FORWARD_TIMEOUT for the requests already in flight, plus half a second
	// for the read itself.
	outageSettle = time.Second + outageTimeout + 500*time.Millisecond
	// outageWatch is the least time the open breaker is watched once every
	// instance stopped: three times the longest a row's three attempts take
	// (three timeouts and the 100ms and 200ms between them), so that attempts
	// spent while the platform is down would run rows out of them.
	outageWatch = 10 * time.Second
)

// rampBound is the most requests in flight an instance may have elapsed
// after the breaker half-opened, replies taking at least rtt: it starts from
// one and adds at most one per round trip (docs/architecture.md, Protecting
// the platform).
func rampBound(elapsed, rtt time.Duration) int {
	return 1 + int(elapsed/rtt)
}

// rampRequests is the most requests one instance may send in the first
// window after the breaker half-opened: at most k in its k-th round trip.
func rampRequests(window, rtt time.Duration) int {
	m := int((window + rtt - 1) / rtt)
	return m * (m + 1) / 2
}

// gateSample is one read of an instance's breaker state and concurrency
// limit, made between from and to.
type gateSample struct {
	from, to             time.Time
	state, limit, paused int
}

// breakerOpen: the sample saw the breaker open.
func breakerOpen(s gateSample) bool { return s.state == 2 }

// sampleGate reads p's breaker state and concurrency limit gauges as fast as
// /metrics answers until stop is called, which returns the samples.
func sampleGate(p *proc) (stop func() []gateSample) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []gateSample)
	go func() {
		var out []gateSample
		for ctx.Err() == nil {
			from := time.Now()
			m, err := scrapeMetrics(ctx, p)
			to := time.Now()
			state, okState := m.value("forwarder_platform_breaker_state", nil)
			limit, okLimit := m.value("forwarder_platform_concurrency_limit", nil)
			paused, okPaused := m.value("forwarder_delivery_paused", nil)
			if err == nil && okState && okLimit && okPaused {
				out = append(out, gateSample{from: from, to: to, state: int(state), limit: int(limit), paused: int(paused)})
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
		done <- out
	}()
	return func() []gateSample {
		cancel()
		return <-done
	}
}

// checkRamp checks one instance's samples around a recovery against the
// ramp's bound: after the last sample that saw sending held (held: the
// breaker open, or delivery paused; the instance let go after that sample
// began), every limit read is at most
// rampBound of the time since (a jump to the maximum within the first
// second would break the bound: (outageMaxInFlight-1) round trips of
// outageLatency are 1.9 s). It returns what it saw, for the log, and how
// many values between 1 and the maximum the limit took: only replies raise
// it, so an instance the others left nothing to send stays at 1, and the
// caller asks the steps of some instance.
func checkRamp(t *testing.T, name string, samples []gateSample, held func(gateSample) bool) (string, int) {
	t.Helper()
	lastOpen := -1
	for i, smp := range samples {
		if held(smp) {
			lastOpen = i
		}
	}
	if lastOpen < 0 || lastOpen == len(samples)-1 {
		t.Errorf("%s: %d samples of the gate and the limit, none held then recovered: the ramp was not watched", name, len(samples))
		return "", 0
	}
	openedAt := samples[lastOpen].from
	between := map[int]bool{}
	var seen, over []string
	prev := -1
	for _, smp := range samples[lastOpen+1:] {
		elapsed := smp.to.Sub(openedAt)
		if bound := rampBound(elapsed, outageLatency); smp.limit > bound {
			over = append(over, fmt.Sprintf("%d at most %v after (allowed %d)", smp.limit, elapsed.Round(time.Millisecond), bound))
		}
		if smp.limit > 1 && smp.limit < outageMaxInFlight {
			between[smp.limit] = true
		}
		if smp.limit != prev {
			seen = append(seen, fmt.Sprintf("%v %d", elapsed.Round(10*time.Millisecond), smp.limit))
			prev = smp.limit
		}
	}
	if len(over) > 0 {
		t.Errorf("%s: the concurrency limit went past the ramp (one more per %v round trip from one at the half-open) %d times: %s",
			name, outageLatency, len(over), strings.Join(over[:min(len(over), 5)], ", "))
	}
	return strings.Join(seen, ", "), len(between)
}

// arrivals records when the platform's request count moved, from now until
// stop: stop returns the time of each request's arrival (at the latest).
func arrivals(platform *mockplatform.Server) (stop func() []time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []time.Time)
	go func() {
		var at []time.Time
		last := platform.Stats().Requests
		_ = platform.WaitFor(ctx, func(st mockplatform.Stats) bool {
			now := time.Now()
			for ; last < st.Requests; last++ {
				at = append(at, now)
			}
			return false
		})
		done <- at
	}()
	return func() []time.Time {
		cancel()
		return <-done
	}
}

// TestOutageFailsNothing takes the platform away under a steady load, with
// three instances: the shared breaker opens, the platform gets nothing but
// probes (at most one per PLATFORM_PROBE_INTERVAL across the three) for at
// least outageWatch once every instance stopped, no row ends FAILED however
// long it lasts, and once it is back every message is delivered (a second
// time only where its attempt log shows a lease that ran out or a request
// that got no reply), with concurrency ramping up rather than jumping: each
// instance's limit stays under the ramp's bound, passing through values
// between 1 and FORWARD_MAX_IN_FLIGHT, and the platform gets at most the
// ramp's requests in the first second of sending after the probe succeeded
// (docs/architecture.md, Protecting the platform). Once with the platform
// answering 503, once with it hanging (timeouts) and one attempt a row.
func TestOutageFailsNothing(t *testing.T) {
	t.Parallel()
	// A hanging platform runs with the least FORWARD_MAX_ATTEMPTS, 1: there
	// any failure counted ends its row FAILED, even a message's first.
	for _, tc := range []struct {
		mode     string
		attempts int
	}{{"Down503", 3}, {"Hanging", 1}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("%s/MaxAttempts%d", mode, tc.attempts), func(t *testing.T) {
			scenario(t, quiet, 35*time.Second)
			env := merged(shortAttempts, map[string]string{
				"FORWARD_MAX_IN_FLIGHT": strconv.Itoa(outageMaxInFlight),
				"FORWARD_TIMEOUT":       outageTimeout.String(),
				"FORWARD_MAX_ATTEMPTS":  strconv.Itoa(tc.attempts),
			})
			s := newStack(t, stackOptions{env: env, faults: mockplatform.Faults{Latency: outageLatency, LatencyJitter: 20 * time.Millisecond}})
			src := s.newSource(eventgen.SourceConfig{})
			procs := []*proc{s.start("fwd-a", nil), s.start("fwd-b", nil), s.start("fwd-c", nil)}
			stopLoad := s.steadyLoad(src, 100)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= 100 }); err != nil {
				t.Fatal(err)
			}

			downAt := time.Now()
			if mode == "Hanging" {
				s.platform.Hang()
			} else {
				s.platform.SetDown(true, 0)
			}
			s.waitUntil("the breaker opens", 15*time.Second, func(ctx context.Context) (bool, string) {
				st := s.breakerState(ctx)
				return st == "OPEN", st
			})
			openAt := time.Now()
			time.Sleep(outageSettle)
			from := s.platform.Stats().Requests
			settledAt := time.Now()
			time.Sleep(time.Until(settledAt.Add(outageWatch)))
			during := s.platform.Stats().Requests - from
			window := time.Since(settledAt)
			failed := s.countStatus(ctx, "FAILED")
			probes := int64(math.Ceil(window.Seconds()/1.0)) + 1
			if during > probes {
				t.Errorf("%d requests reached the platform in %v while the breaker was open, want at most %d probes (one per second across the 3 instances)",
					during, window.Round(time.Millisecond), probes)
			}
			if failed != 0 {
				t.Errorf("%d rows FAILED during a %v outage (began at %s); their attempts:\n  %s", failed, time.Since(downAt).Round(time.Millisecond),
					downAt.Format(time.StampMilli), strings.Join(s.attemptsOf(ctx, "FAILED", 5), "\n  "))
			}

			// Recovery: watch every instance's limit ramp up, and the
			// requests reaching the platform.
			samplers := make([]func() []gateSample, len(procs))
			for i, p := range procs {
				samplers[i] = sampleGate(p)
			}
			time.Sleep(300 * time.Millisecond) // a few samples of the open breaker first
			stopArrivals := arrivals(s.platform)
			upAt := time.Now()
			if mode == "Hanging" {
				s.platform.Release()
			} else {
				s.platform.SetDown(false, 0)
			}
			s.waitUntil("the breaker closes", time.Minute, func(ctx context.Context) (bool, string) {
				st := s.breakerState(ctx)
				return st == "CLOSED", st
			})
			closedAfter := time.Since(upAt)
			// The ramp to FORWARD_MAX_IN_FLIGHT takes at least 1.9 s from
			// the half-open; the breaker closes after ten healthy replies.
			time.Sleep(3 * time.Second)
			var (
				ramps []string
				steps int
			)
			for i, stop := range samplers {
				seen, n := checkRamp(t, procs[i].name, stop(), breakerOpen)
				ramps = append(ramps, procs[i].name+": "+seen)
				steps = max(steps, n)
			}
			if steps < 2 {
				t.Errorf("no instance's limit took two values between 1 and %d after the breaker half-opened (%s): no ramp seen",
					outageMaxInFlight, strings.Join(ramps, "; "))
			}
			at := stopArrivals()

			// The first reply the platform accepted after it came back is a
			// probe's (only probes go while the breaker is open): every
			// instance half-opened after it, with a limit of one that only
			// replies raise. So from the first request after it, each
			// instance's requests follow the ramp whenever it started (a
			// second probe may come from an instance that has not yet seen
			// the first succeed).
			var probeAt, firstAt time.Time
			for _, d := range s.platform.Deliveries() {
				if d.FirstAt.After(upAt) && (probeAt.IsZero() || d.FirstAt.Before(probeAt)) {
					probeAt = d.FirstAt
				}
			}
			firstSecond := 0
			for _, a := range at {
				if !probeAt.IsZero() && a.After(probeAt) {
					if firstAt.IsZero() {
						firstAt = a
					}
					if !a.After(firstAt.Add(time.Second)) {
						firstSecond++
					}
				}
			}
			allowed := len(procs)*rampRequests(time.Second, outageLatency) + 2
			switch {
			case firstAt.IsZero():
				t.Errorf("no request was sent after a probe succeeded")
			case firstSecond > allowed:
				t.Errorf("%d requests reached the platform in the first second of sending after the breaker half-opened; the ramp allows at most %d (%d instances, at most k requests in the k-th %v round trip)",
					firstSecond, allowed, len(procs), outageLatency)
			}

			stopLoad()
			s.waitSettled(2 * time.Minute)
			r := s.verify()
			// A message may go twice only where its attempt log says why (a
			// lease that ran out, a request without a reply): with two-second
			// leases a database stalled that long on a loaded machine does it.
			if r.unexplainedDups != 0 {
				t.Errorf("%d deliveries of %d messages delivered twice have no lost lease or unanswered request to explain them:%s",
					r.unexplainedDups, r.dupMessages, s.dupHistory(r))
			}
			if st := s.platform.Stats(); st.PeakInFlight > 3*outageMaxInFlight {
				t.Errorf("peak %d requests in flight, more than 3 x FORWARD_MAX_IN_FLIGHT", st.PeakInFlight)
			}
			t.Logf("%s: open %v after the outage began; %d requests in %v while open (at most %d allowed); rows FAILED during the outage %d; "+
				"closed %v after recovery; %d requests in the first second of sending after the probe succeeded (at most %d); limits after the half-open (time since, limit): %s; %s",
				mode, openAt.Sub(downAt).Round(time.Millisecond), during, window.Round(time.Millisecond), probes, failed,
				closedAfter.Round(time.Millisecond), firstSecond, allowed, strings.Join(ramps, "; "), r)
		})
	}
}

// TestAnInstanceCutOffFromThePlatform: one of three instances loses its
// network to the platform (its connections closed, new ones refused) while
// the other two reach it, under a steady load with one attempt a row. The
// platform is up: the others' healthy replies, announced, keep the cut
// instance from opening the breaker for all, its failures spend no attempt
// (one counted would end its row FAILED), and the rows it fails are
// delivered by the others (docs/architecture.md, "The platform answering
// any instance is up").
func TestAnInstanceCutOffFromThePlatform(t *testing.T) {
	scenario(t, quiet, 20*time.Second)
	s := newStack(t, stackOptions{env: map[string]string{"FORWARD_MAX_ATTEMPTS": "1"}})
	platform, err := url.Parse(s.platform.URL)
	if err != nil {
		t.Fatal(err)
	}
	network := tcpproxy.New(t, platform.Host, tcpproxy.Options{})
	through := *platform
	through.Host = network.Addr()
	procs := []*proc{s.start("fwd-a", nil), s.start("fwd-b", nil),
		s.start("fwd-cut", map[string]string{"PLATFORM_URL": through.String()})}
	cut := procs[2]
	watch := s.breakerWatch()
	stopLoad := s.steadyLoad(s.newSource(eventgen.SourceConfig{Berths: 200}), 100)
	defer stopLoad()

	attempts := func(ctx context.Context, after time.Time) (delivered, failed, counted int) {
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE result_status = 'SUCCESS'),
				count(*) FILTER (WHERE result_status <> 'SUCCESS'),
				count(*) FILTER (WHERE result_status <> 'SUCCESS' AND error_message NOT LIKE 'platform unavailable, attempt not counted%')
			FROM forward_retry_logs WHERE attempted_by = $1 AND attempted_at > $2`, cut.claimer(), after).Scan(&delivered, &failed, &counted); err != nil {
			t.Fatal(err)
		}
		return delivered, failed, counted
	}
	s.waitUntil("the instance to be cut delivering", 30*time.Second, func(ctx context.Context) (bool, string) {
		d, _, _ := attempts(ctx, time.Time{})
		return d >= 20, fmt.Sprintf("%d delivered by %s", d, cut.name)
	})
	cutAt := time.Now()
	network.Cut()
	time.Sleep(15 * time.Second)
	stopLoad()
	s.waitSettled(time.Minute)
	seen := watch()
	r := s.verify()

	ctx := context.Background()
	_, failed, counted := attempts(ctx, cutAt)
	// A request in flight at the cut may have been answered: a second's
	// margin for its result write.
	delivered, _, _ := attempts(ctx, cutAt.Add(time.Second))
	if delivered != 0 {
		t.Errorf("%s delivered %d messages after its network to the platform was cut: the cut did not hold", cut.name, delivered)
	}
	if failed < 10 {
		t.Errorf("%s made %d attempts after the cut, want at least 10: it did not go on claiming rows and failing them, so the scenario proves nothing", cut.name, failed)
	}
	if counted != 0 {
		t.Errorf("%d of the %d attempts %s failed after the cut counted:\n  %s", counted, failed, cut.name, strings.Join(s.attemptsOf(ctx, "FAILED", 5), "\n  "))
	}
	s.assertNeverOpened(seen, procs)
	t.Logf("%s, cut off, failed %d attempts, none counted; breaker states %v; %s", cut.name, failed, seen, r)
}

// TestRetryAfterPausesEveryInstance: one 429 with Retry-After stops both
// instances for as long as it asks, capped at FORWARD_RETRY_MAX: nothing
// reaches the platform while the pause is shared, the first request after
// it comes no sooner than the pause's length after the 429 and within two
// reads of the shared state (a second each) after it ends. Once with
// Retry-After under the cap, once over it.
func TestRetryAfterPausesEveryInstance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// header is the Retry-After the platform answers; retryMax is
		// FORWARD_RETRY_MAX; want is the pause they make.
		header, retryMax, want time.Duration
	}{
		{name: "UnderTheCap", header: 6 * time.Second, retryMax: 10 * time.Second, want: 6 * time.Second},
		{name: "CappedByRetryMax", header: 12 * time.Second, retryMax: 5 * time.Second, want: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scenario(t, quiet, 12*time.Second)
			s := newStack(t, stackOptions{env: merged(shortAttempts, map[string]string{"FORWARD_RETRY_MAX": tc.retryMax.String()})})
			src := s.newSource(eventgen.SourceConfig{})
			s.start("fwd-a", nil)
			s.start("fwd-b", nil)
			stopLoad := s.steadyLoad(src, 100)
			defer stopLoad()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= 50 }); err != nil {
				t.Fatal(err)
			}
			stopArrivals := arrivals(s.platform)
			// Every 429 is answered between before and upAt, so the pause
			// it asks for ends between before+want and upAt+want.
			before := time.Now()
			s.platform.SetDownWith(true, http.StatusTooManyRequests, tc.header)
			if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Unavailable > 0 }); err != nil {
				t.Fatal(err)
			}
			s.platform.SetDown(false, 0)
			upAt := time.Now()
			// The pause is shared when an instance handles the 429 and
			// writes it in the database, on a loaded machine a moment after
			// the answer: the watch starts then.
			var until time.Time
			for {
				err := s.pool.QueryRow(ctx, `SELECT paused_until FROM forward_platform_state WHERE paused_until > now()`).Scan(&until)
				if err == nil {
					break
				}
				if time.Since(before) > tc.want {
					t.Fatalf("no instance shared the pause within %v of the 429: %v", tc.want, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			sharedAt := time.Now()
			if until.Before(before.Add(tc.want)) {
				t.Errorf("the shared pause ends %v after the 429: shorter than %v (Retry-After %v, FORWARD_RETRY_MAX %v)",
					until.Sub(before).Round(time.Millisecond), tc.want, tc.header, tc.retryMax)
			}
			// From a second and a half after it was shared (every instance
			// reads the shared state each second) to half a second before
			// it ends, nothing is sent.
			from, to := sharedAt.Add(1500*time.Millisecond), until.Add(-500*time.Millisecond)
			if to.Sub(from) < time.Second {
				t.Fatalf("the pause was shared %v after the 429 and ends %v after it: less than a second left to watch",
					sharedAt.Sub(before).Round(time.Millisecond), until.Sub(before).Round(time.Millisecond))
			}
			// Its end, as the platform sees it: the first request after
			// from. Watched until two reads of the shared state after the
			// longest the pause may last.
			const resumeSlack = 2 * time.Second
			time.Sleep(time.Until(from))
			sent := s.platform.Stats().Requests
			time.Sleep(time.Until(to))
			paused := s.platform.Stats().Requests - sent
			time.Sleep(time.Until(upAt.Add(tc.want + resumeSlack + 500*time.Millisecond)))
			var resumedAt time.Time
			for _, a := range stopArrivals() {
				if !a.Before(to) {
					resumedAt = a
					break
				}
			}
			if paused != 0 {
				t.Errorf("%d requests during a %v Retry-After pause (watched %v of it)", paused, tc.want, to.Sub(from).Round(time.Millisecond))
			}
			switch {
			case resumedAt.IsZero():
				t.Errorf("no request reached the platform within %v of the end of a %v pause (Retry-After %v, FORWARD_RETRY_MAX %v)",
					resumeSlack, tc.want, tc.header, tc.retryMax)
			case resumedAt.Before(before.Add(tc.want)):
				t.Errorf("sending resumed %v after the 429: a pause shorter than %v (Retry-After %v, FORWARD_RETRY_MAX %v)",
					resumedAt.Sub(before).Round(time.Millisecond), tc.want, tc.header, tc.retryMax)
			case resumedAt.After(upAt.Add(tc.want + resumeSlack)):
				t.Errorf("sending resumed %v after the 429: a pause longer than %v (Retry-After %v, FORWARD_RETRY_MAX %v)",
					resumedAt.Sub(before).Round(time.Millisecond), tc.want, tc.header, tc.retryMax)
			}
			stopLoad()
			s.waitSettled(time.Minute)
			r := s.verify()
			resumed := "never"
			if !resumedAt.IsZero() {
				resumed = resumedAt.Sub(before).Round(time.Millisecond).String() + " after the 429"
			}
			t.Logf("Retry-After %v, FORWARD_RETRY_MAX %v: pause shared %v after the 429, until %v after it; %d requests from %v to %v; resumed %s (want %v to %v); %s",
				tc.header, tc.retryMax, sharedAt.Sub(before).Round(time.Millisecond), until.Sub(before).Round(time.Millisecond), paused,
				from.Sub(before).Round(time.Millisecond), to.Sub(before).Round(time.Millisecond), resumed,
				tc.want, upAt.Add(tc.want+resumeSlack).Sub(before).Round(time.Millisecond), r)
		})
	}
}

// TestRateLimitAcrossInstances drains a backlog with two instances under
// FORWARD_RATE_LIMIT: the platform never sees more than the limit per
// second, give or take one bucket.
func TestRateLimitAcrossInstances(t *testing.T) {
	scenario(t, quiet, 20*time.Second)
	const limit = 100
	s := newStack(t, stackOptions{env: map[string]string{"FORWARD_RATE_LIMIT": strconv.Itoa(limit)}})
	n := load(1_500, 600)
	s.produce(s.newSource(eventgen.SourceConfig{}), n)
	var samples []int64
	var times []time.Time
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			samples = append(samples, s.platform.Stats().Requests)
			times = append(times, time.Now())
			time.Sleep(50 * time.Millisecond)
		}
	}()
	s.start("fwd-a", nil)
	s.start("fwd-b", nil)
	s.waitSettled(2 * time.Minute)
	stop.Store(true)
	wg.Wait()
	// Every request is in: the drain has settled.
	samples, times = append(samples, s.platform.Stats().Requests), append(times, time.Now())
	r := s.verify()
	// Windows of one second, from 1.5 s after the first request on (the
	// shared bucket starts full: one second's worth may go at once). The
	// sampling starts before the instances do, and they may take that long
	// to start on a busy machine: counted from the first sample, a window
	// held the initial burst and the next second's refill.
	first := slices.IndexFunc(samples, func(n int64) bool { return n > 0 })
	if first < 0 {
		t.Fatal("no request reached the platform")
	}
	worst := int64(0)
	for i := range samples {
		if times[i].Sub(times[first]) < 1500*time.Millisecond {
			continue
		}
		for j := i; j < len(samples) && times[j].Sub(times[i]) <= time.Second; j++ {
			worst = max(worst, samples[j]-samples[i])
		}
	}
	// Give or take one bucket: a chunk (a tenth of a second's worth) per
	// instance taken ahead of use, and one more refilled at the window's
	// edge.
	if allowed := int64(limit + 3*limit/10); worst > allowed {
		t.Errorf("%d requests within one second, limit %d (+ %d for the chunks the two instances hold)", worst, limit, allowed-limit)
	}
	// The average over the drain, from the last sample before the first
	// request to the first sample after the last one (both bounds err on
	// the long side): the initial full bucket, then the limit, give or take
	// the chunks, which spread over the drain are a few per cent.
	start := times[max(first-1, 0)]
	last := slices.Index(samples, samples[len(samples)-1])
	elapsed := times[last].Sub(start)
	if rate := float64(samples[last]-limit) / elapsed.Seconds(); rate > 1.1*limit {
		t.Errorf("%d requests in %v after the initial burst of %d: %.0f/s, limit %d", samples[last]-limit, elapsed.Round(time.Millisecond), limit, rate, limit)
	}
	t.Logf("worst second %d requests (limit %d), %d requests in %v; %s", worst, limit, samples[last], elapsed.Round(time.Millisecond), r)
}

// TestHealthyErrorsKeepTheBreakerClosed: a platform that answers errcode
// 999 to 30 % of requests is up (it answered); the breaker never opens,
// and the rows are retried on the jittered schedule.
func TestHealthyErrorsKeepTheBreakerClosed(t *testing.T) {
	scenario(t, light, 14*time.Second)
	s := newStack(t, stackOptions{
		env:    map[string]string{"FORWARD_RETRY_INITIAL": "200ms", "FORWARD_RETRY_MAX": "2s", "FORWARD_MAX_ATTEMPTS": "50"},
		faults: mockplatform.Faults{Errcode999: 0.3},
	})
	n := load(2_000, 600)
	s.produce(s.newSource(eventgen.SourceConfig{DuplicateRate: 0.01}), n)
	p := s.start("forwarder", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var opened atomic.Bool
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var st string
			if err := s.pool.QueryRow(ctx, "SELECT breaker_state FROM forward_platform_state").Scan(&st); err == nil && st != "CLOSED" {
				opened.Store(true)
			}
		}
	}()
	s.waitSettled(2 * time.Minute)
	close(done)
	r := s.verify()
	if opened.Load() {
		t.Error("the breaker left CLOSED while the platform answered every request")
	}
	if probes := mustScrape(t, ctx, p).require(t, "forwarder_platform_probes_total", nil); probes != 0 {
		t.Errorf("%v probes sent", probes)
	}

	// The retry schedule: each 999 leaves the row PENDING for
	// min(200ms * 2^(attempt-1), 2s) +-10 %. attempted_at and next_retry_at
	// of an attempt log are written in one transaction, so their difference
	// is exactly the delay the forwarder chose.
	rows, err := s.pool.Query(ctx, `SELECT attempt_number, extract(epoch FROM next_retry_at - attempted_at) * 1000
		FROM forward_retry_logs WHERE result_status = 'PENDING' AND platform_errcode = '999'`)
	if err != nil {
		t.Fatal(err)
	}
	var retries, outside int
	distinct := map[int64]bool{}
	var worst string
	for rows.Next() {
		var attempt int
		var delayMs float64
		if err := rows.Scan(&attempt, &delayMs); err != nil {
			t.Fatal(err)
		}
		retries++
		nominal := math.Min(200*math.Pow(2, float64(attempt-1)), 2000)
		if delayMs < 0.9*nominal-1 || delayMs > 1.1*nominal+1 {
			outside++
			worst = fmt.Sprintf("attempt %d waited %.0f ms, want %.0f ms +-10 %%", attempt, delayMs, nominal)
		}
		distinct[int64(math.Round(delayMs))] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	switch {
	case retries == 0:
		t.Errorf("no attempt log of a 999 scheduled a retry")
	case outside > 0:
		t.Errorf("%d of %d retries after a 999 are off the schedule, e.g. %s", outside, retries, worst)
	case len(distinct) < 10:
		t.Errorf("%d retries after a 999 used only %d distinct delays: not jittered", retries, len(distinct))
	}
	t.Logf("%d retries on the schedule (%d distinct delays), breaker closed throughout: %s", retries, len(distinct), r)
}

// TestCompensation: rows FAILED because their attempts ran out on
// transient errors come back FAILED_REQUEUE_AFTER later, at most
// FAILED_REQUEUE_ROUNDS times, each round in the attempt log; rows the
// platform rejected (errcode 998) never do.
func TestCompensation(t *testing.T) {
	scenario(t, light, 9*time.Second)
	const rounds = 2
	s := newStack(t, stackOptions{
		env: map[string]string{
			"FORWARD_RETRY_INITIAL": "50ms", "FORWARD_RETRY_MAX": "100ms", "FORWARD_MAX_ATTEMPTS": "2",
			"FAILED_REQUEUE_AFTER": "1s", "FAILED_REQUEUE_ROUNDS": strconv.Itoa(rounds),
		},
		// 999 is retried but healthy: the breaker stays closed while a
		// fifth of the rows run out of attempts each round.
		faults: mockplatform.Faults{Errcode999: 0.45, Errcode998: 0.05},
	})
	n := load(1_000, 400)
	s.produce(s.newSource(eventgen.SourceConfig{}), n)
	s.start("forwarder", nil)
	s.waitUntil("every row delivered, rejected, or frozen after its rounds", 3*time.Minute, func(ctx context.Context) (bool, string) {
		var rows, open, waiting int
		// The tables, not the view: see rowCounts.
		if err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM forward_messages),
				count(*) FILTER (WHERE status IN ('PENDING', 'IN_PROGRESS')),
				count(*) FILTER (WHERE status = 'FAILED' AND failure_class = 'TRANSIENT' AND requeue_rounds < $1)
			FROM forward_deliveries`, rounds).Scan(&rows, &open, &waiting); err != nil {
			return false, err.Error()
		}
		return rows == n && open == 0 && waiting == 0, fmt.Sprintf("%d of %d rows, %d unfinished, %d awaiting compensation", rows, n, open, waiting)
	})
	ctx := context.Background()
	var requeuedRows, logs, rejectedRequeued, beyond, frozen, rejected int
	if err := s.pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE requeue_rounds > 0),
			(SELECT count(*) FROM forward_retry_logs WHERE result_status = 'REQUEUED'),
			-- A requeue after an errcode-998 answer (a row may be rejected
			-- in a later round, after transient failures).
			(SELECT count(*) FROM forward_retry_logs rq JOIN forward_retry_logs rj
			    ON rj.record_id = rq.record_id AND rj.platform_errcode = '998' AND rj.id < rq.id
			 WHERE rq.result_status = 'REQUEUED'),
			count(*) FILTER (WHERE requeue_rounds > $1),
			count(*) FILTER (WHERE status = 'FAILED' AND failure_class = 'TRANSIENT'),
			count(*) FILTER (WHERE failure_class = 'REJECTED')
		FROM forward_records`, rounds).Scan(&requeuedRows, &logs, &rejectedRequeued, &beyond, &frozen, &rejected); err != nil {
		t.Fatal(err)
	}
	switch {
	case requeuedRows == 0 || logs < requeuedRows:
		t.Errorf("%d rows requeued, %d REQUEUED logs: compensation did not run", requeuedRows, logs)
	case rejectedRequeued != 0:
		t.Errorf("%d requeues after an errcode-998 rejection", rejectedRequeued)
	case beyond != 0:
		t.Errorf("%d rows requeued more than %d times", beyond, rounds)
	case rejected == 0:
		t.Errorf("no row was rejected: the test proves nothing about 998")
	}
	t.Logf("%d rows requeued (%d rounds logged), %d frozen after %d rounds, %d rejected and left alone", requeuedRows, logs, frozen, rounds, rejected)
}

func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}
