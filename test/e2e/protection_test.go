package e2e_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
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

func (s *stack) countStatus(ctx context.Context, status string) int {
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM forward_records WHERE status = $1", status).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
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

// TestOutageFailsNothing takes the platform away for ten times what a row's
// attempts take, under a steady load, with three instances: the shared
// breaker opens, the platform gets nothing but probes (at most one per
// PLATFORM_PROBE_INTERVAL across the three) while it is open, no row ends
// FAILED however long it lasts, and once it is back every message is
// delivered exactly once, with concurrency ramping up rather than jumping.
// Once with the platform answering 503, once with it hanging (timeouts).
func TestOutageFailsNothing(t *testing.T) {
	for _, mode := range []string{"Down503", "Hanging"} {
		t.Run(mode, func(t *testing.T) {
			env := merged(shortAttempts, map[string]string{"FORWARD_MAX_IN_FLIGHT": "20"})
			s := newStack(t, stackOptions{env: env, faults: mockplatform.Faults{Latency: 20 * time.Millisecond}})
			src := s.newSource(eventgen.SourceConfig{})
			procs := []*proc{s.start("fwd-a", nil), s.start("fwd-b", nil), s.start("fwd-c", nil)}
			stopLoad := s.steadyLoad(src, 100)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= 100 }); err != nil {
				t.Fatal(err)
			}

			const outage = 12 * time.Second // ten times three attempts of ~0.4s
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
			// Every instance follows within its sync interval (1s); what is
			// in flight when it opened finishes within FORWARD_TIMEOUT.
			time.Sleep(2 * time.Second)
			from := s.platform.Stats().Requests
			settledAt := time.Now()
			time.Sleep(time.Until(downAt.Add(outage)))
			during := s.platform.Stats().Requests - from
			window := time.Since(settledAt)
			failed := s.countStatus(ctx, "FAILED")
			probes := int64(math.Ceil(window.Seconds()/1.0)) + 1
			if during > probes {
				t.Errorf("%d requests reached the platform in %v while the breaker was open, want at most %d probes (one per second across the 3 instances)",
					during, window.Round(time.Millisecond), probes)
			}
			if failed != 0 {
				t.Errorf("%d rows FAILED during a %v outage", failed, outage)
			}

			// Recovery: watch one instance's concurrency limit ramp up.
			if mode == "Hanging" {
				s.platform.Release()
			} else {
				s.platform.SetDown(false, 0)
			}
			upAt := time.Now()
			var limits []int
			s.waitUntil("the breaker closes", time.Minute, func(ctx context.Context) (bool, string) {
				if m, err := scrapeMetrics(ctx, procs[0]); err == nil {
					if l, ok := m.value("forwarder_platform_concurrency_limit", nil); ok {
						limits = append(limits, int(l))
					}
				}
				st := s.breakerState(ctx)
				return st == "CLOSED", st
			})
			stopLoad()
			s.waitSettled(2 * time.Minute)
			r := s.verify()
			if r.dupDeliveries != 0 {
				t.Errorf("%d messages were delivered twice", r.dupDeliveries)
			}
			if len(limits) == 0 || limits[0] > 4 {
				t.Errorf("concurrency limits after the platform came back %v: want a ramp starting from 1", limits)
			}
			if st := s.platform.Stats(); st.PeakInFlight > 3*20 {
				t.Errorf("peak %d requests in flight, more than 3 x FORWARD_MAX_IN_FLIGHT", st.PeakInFlight)
			}
			t.Logf("%s: open %v after the outage began; %d requests in %v while open (at most %d allowed); rows FAILED during the outage %d; "+
				"closed %v after recovery, limits seen %v; %s",
				mode, openAt.Sub(downAt).Round(time.Millisecond), during, window.Round(time.Millisecond), probes, failed,
				time.Since(upAt).Round(time.Millisecond), limits, r)
		})
	}
}

// TestRetryAfterPausesEveryInstance: one 429 with Retry-After stops both
// instances for that long.
func TestRetryAfterPausesEveryInstance(t *testing.T) {
	const retryAfter = 6 * time.Second
	// FORWARD_RETRY_MAX caps a Retry-After: above the one asked for.
	s := newStack(t, stackOptions{env: merged(shortAttempts, map[string]string{"FORWARD_RETRY_MAX": "10s"})})
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
	s.platform.SetDownWith(true, http.StatusTooManyRequests, retryAfter)
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Unavailable > 0 }); err != nil {
		t.Fatal(err)
	}
	answeredAt := time.Now()
	s.platform.SetDown(false, 0)
	// The pause begins when an instance handles the 429 and shares it in
	// the database, on a loaded machine a moment after the answer: measure
	// from then, and until it ends.
	var until time.Time
	for {
		err := s.pool.QueryRow(ctx, `SELECT paused_until FROM forward_platform_state WHERE paused_until > now()`).Scan(&until)
		if err == nil {
			break
		}
		if time.Since(answeredAt) > retryAfter {
			t.Fatalf("no instance shared the pause within %v of the 429: %v", retryAfter, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sharedAt := time.Now()
	// From a second and a half after it was shared (every instance reads
	// the shared state each second) to half a second before it ends,
	// nothing is sent.
	from, to := sharedAt.Add(1500*time.Millisecond), until.Add(-500*time.Millisecond)
	if to.Sub(from) < time.Second {
		t.Fatalf("the pause was shared %v after the 429 and ends %v after it: less than a second left to watch",
			sharedAt.Sub(answeredAt).Round(time.Millisecond), until.Sub(answeredAt).Round(time.Millisecond))
	}
	time.Sleep(time.Until(from))
	before := s.platform.Stats().Requests
	time.Sleep(time.Until(to))
	paused := s.platform.Stats().Requests - before
	if paused != 0 {
		t.Errorf("%d requests during a %v Retry-After pause (watched %v of it)", paused, retryAfter, to.Sub(from).Round(time.Millisecond))
	}
	stopLoad()
	s.waitSettled(time.Minute)
	r := s.verify()
	t.Logf("%d requests from %v to %v after the 429 (pause shared after %v, until %v): %s", paused,
		from.Sub(answeredAt).Round(time.Millisecond), to.Sub(answeredAt).Round(time.Millisecond),
		sharedAt.Sub(answeredAt).Round(time.Millisecond), until.Sub(answeredAt).Round(time.Millisecond), r)
}

// TestRateLimitAcrossInstances drains a backlog with two instances under
// FORWARD_RATE_LIMIT: the platform never sees more than the limit per
// second, give or take one bucket.
func TestRateLimitAcrossInstances(t *testing.T) {
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
	r := s.verify()
	// Windows of one second, after the first 1.5s (the shared bucket starts
	// full: one second's worth may go at once).
	worst := int64(0)
	for i := range samples {
		if times[i].Sub(times[0]) < 1500*time.Millisecond {
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
	elapsed := times[len(times)-1].Sub(times[0])
	if rate := float64(r.platformRequests) / elapsed.Seconds(); rate > 1.2*limit {
		t.Errorf("average %.0f requests/s over the drain, limit %d", rate, limit)
	}
	t.Logf("worst second %d requests (limit %d), %d requests in %v; %s", worst, limit, r.platformRequests, elapsed.Round(time.Millisecond), r)
}

// TestHealthyErrorsKeepTheBreakerClosed: a platform that answers errcode
// 999 to 30 % of requests is up (it answered); the breaker never opens,
// and the rows are retried on the jittered schedule.
func TestHealthyErrorsKeepTheBreakerClosed(t *testing.T) {
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
		if err := s.pool.QueryRow(ctx, `SELECT count(*),
				count(*) FILTER (WHERE status IN ('PENDING', 'IN_PROGRESS')),
				count(*) FILTER (WHERE status = 'FAILED' AND failure_class = 'TRANSIENT' AND requeue_rounds < $1)
			FROM forward_records`, rounds).Scan(&rows, &open, &waiting); err != nil {
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
