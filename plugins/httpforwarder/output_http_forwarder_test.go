package httpforwarder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestResponseClasses sends one claimed row (first attempt of three) to a
// platform answering each response class of docs/configuration.md#platform-responses and checks the row
// and its attempt log.
func TestResponseClasses(t *testing.T) {
	t.Parallel()

	type want struct {
		status      string
		httpStatus  string // "<nil>" for none
		errcode     string // "<nil>" for none
		errContains string // in last_error and the log's error_message; "" means NULL
		retryIn     [2]time.Duration
	}
	// The first retry waits initial (1s) ± 10 %.
	firstRetry := [2]time.Duration{900 * time.Millisecond, 1100 * time.Millisecond}

	for _, tc := range []struct {
		name    string
		handler func(http.ResponseWriter, *http.Request, []byte)
		url     string
		extra   string
		want    want
	}{
		{
			name:    "Result0IsSuccess",
			handler: reply(200, `{"result":0,"errcode":"0","message":"ok"}`),
			want:    want{status: "SUCCESS", httpStatus: "200", errcode: "0"},
		},
		{
			name:    "Result0AsStringIsSuccess",
			handler: reply(200, `{"result":"0"}`),
			want:    want{status: "SUCCESS", httpStatus: "200", errcode: "<nil>"},
		},
		{
			name:    "Errcode4StringIsDuplicateSuccess",
			handler: reply(200, `{"result":1,"errcode":"4","message":"duplicate report"}`),
			want:    want{status: "SUCCESS", httpStatus: "200", errcode: "4"},
		},
		{
			name:    "Errcode4NumberIsDuplicateSuccess",
			handler: reply(200, `{"result":1,"errcode":4}`),
			want:    want{status: "SUCCESS", httpStatus: "200", errcode: "4"},
		},
		{
			name:    "Errcode998IsFailedWithoutRetry",
			handler: reply(200, `{"result":1,"errcode":"998","message":"do not resend"}`),
			want:    want{status: "FAILED", httpStatus: "200", errcode: "998", errContains: `not retried (rules[1] no_retry): http 200: {"result":1,"errcode":"998"`},
		},
		{
			name:    "Errcode999IsRetried",
			handler: reply(200, `{"result":1,"errcode":"999","message":"busy"}`),
			want:    want{status: "PENDING", httpStatus: "200", errcode: "999", errContains: `http 200: {"result":1,"errcode":"999"`, retryIn: firstRetry},
		},
		{
			name:    "HTTP500IsRetried",
			handler: reply(500, `internal error`),
			want:    want{status: "PENDING", httpStatus: "500", errcode: "<nil>", errContains: "http 500: internal error", retryIn: firstRetry},
		},
		{
			name:    "HTTP500WithSuccessBodyIsRetried",
			handler: reply(500, `{"result":0}`),
			want:    want{status: "PENDING", httpStatus: "500", errcode: "<nil>", errContains: "http 500", retryIn: firstRetry},
		},
		{
			name:    "HTTP429HonoursRetryAfter",
			handler: reply(429, `slow down`, "Retry-After", "7"),
			want:    want{status: "PENDING", httpStatus: "429", errcode: "<nil>", errContains: "http 429: slow down", retryIn: [2]time.Duration{7 * time.Second, 7 * time.Second}},
		},
		{
			name:    "HTTP503RetryAfterIsCappedAtMax",
			handler: reply(503, ``, "Retry-After", "3600"),
			want:    want{status: "PENDING", httpStatus: "503", errcode: "<nil>", errContains: "http 503 (empty body)", retryIn: [2]time.Duration{10 * time.Second, 10 * time.Second}},
		},
		{
			name:    "RetryAfterIgnoredOn500",
			handler: reply(500, `x`, "Retry-After", "7"),
			want:    want{status: "PENDING", httpStatus: "500", errcode: "<nil>", errContains: "http 500", retryIn: firstRetry},
		},
		{
			name:    "RuleOnHeaders",
			handler: reply(500, `gone`, "X-Platform-Verdict", "drop"),
			extra:   "rules:\n  - when: 'headers[\"X-Platform-Verdict\"] == \"drop\"'\n    outcome: no_retry",
			want:    want{status: "FAILED", httpStatus: "500", errcode: "<nil>", errContains: "not retried (rules[0] no_retry): http 500: gone"},
		},
		{
			name:    "NonJSON200IsRetried",
			handler: reply(200, `<html>OK</html>`),
			want:    want{status: "PENDING", httpStatus: "200", errcode: "<nil>", errContains: "http 200: <html>OK</html>", retryIn: firstRetry},
		},
		{
			name: "TimeoutIsRetried",
			handler: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				select {
				case <-r.Context().Done():
				case <-time.After(10 * time.Second):
				}
			},
			extra: "timeout: 300ms",
			want:  want{status: "PENDING", httpStatus: "<nil>", errcode: "<nil>", errContains: "request timed out after 300ms", retryIn: firstRetry},
		},
		{
			name:  "ConnectionRefusedIsRetried",
			url:   closedURL(t),
			want:  want{status: "PENDING", httpStatus: "<nil>", errcode: "<nil>", errContains: "connection refused", retryIn: firstRetry},
			extra: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{handler: tc.handler, url: tc.url, extra: tc.extra})
			r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
			if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(r, mappedBody(r))}); err != nil {
				t.Fatalf("WriteBatch returned %v, want nil once recorded", err)
			}

			got := b.row(t, r.ID)
			if got.Status != tc.want.status || got.AttemptCount != 1 || num(got.HTTPStatus) != tc.want.httpStatus {
				t.Fatalf("row: status %s attempts %d http %s, want %s 1 %s (last_error %s)",
					got.Status, got.AttemptCount, num(got.HTTPStatus), tc.want.status, tc.want.httpStatus, str(got.LastError))
			}
			if len(got.Logs) != 1 {
				t.Fatalf("log rows %+v, want one", got.Logs)
			}
			l := got.Logs[0]
			if l.Attempt != 1 || l.Status != tc.want.status || num(l.HTTPStatus) != tc.want.httpStatus ||
				str(l.Errcode) != tc.want.errcode || l.DurationMs == nil {
				t.Errorf("log row: attempt %d status %s http %s errcode %s duration %s, want 1 %s %s %s set",
					l.Attempt, l.Status, num(l.HTTPStatus), str(l.Errcode), num(l.DurationMs), tc.want.status, tc.want.httpStatus, tc.want.errcode)
			}
			if tc.want.errContains == "" {
				if got.LastError != nil || l.Error != nil {
					t.Errorf("last_error %q, log error %q, want NULL", str(got.LastError), str(l.Error))
				}
			} else if !strings.Contains(str(got.LastError), tc.want.errContains) || str(l.Error) != str(got.LastError) {
				t.Errorf("last_error %q, log error %q, want both containing %q", str(got.LastError), str(l.Error), tc.want.errContains)
			}

			switch got.Status {
			case "SUCCESS":
				if !got.Succeeded || got.Due != nil || l.RetryIn != nil {
					t.Errorf("SUCCESS row: succeeded_at set %v, next_retry_at %v, log next_retry_at %v", got.Succeeded, got.Due, l.RetryIn)
				}
			case "FAILED":
				if got.Succeeded || got.Due != nil || l.RetryIn != nil {
					t.Errorf("FAILED row: succeeded_at set %v, next_retry_at %v", got.Succeeded, got.Due)
				}
			case "PENDING":
				if l.RetryIn == nil || *l.RetryIn < tc.want.retryIn[0] || *l.RetryIn > tc.want.retryIn[1] {
					t.Errorf("retry in %v, want within %v", l.RetryIn, tc.want.retryIn)
				}
			}
			if tc.url == "" && len(b.platform.received()) != 1 {
				t.Errorf("platform received %d requests, want 1", len(b.platform.received()))
			}
		})
	}
}

// closedURL is the address of a port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	// A socket bound to the port but not listening: a connection to it is
	// refused, and no other test's listener can take the port while it is
	// held (a listener closed at once could hand its port to one, whose
	// server would answer with EOF instead).
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// TestRetriesUntilFailed drives one row through errcode "999" replies until
// it is FAILED at max_attempts, claiming it again each time as outbox_retry
// would, and checks the backoff chosen for each retry.
func TestRetriesUntilFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{handler: reply(200, `{"result":1,"errcode":"999"}`)})
	claimed := b.claim(t, 1, outboxdb.APITypeHeartbeat)
	id := claimed[0].ID
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			b.makeDue(t, id)
			claimed = b.claimDue(t, 1)
		}
		if len(claimed) != 1 || claimed[0].AttemptCount != attempt {
			t.Fatalf("attempt %d: claimed %+v", attempt, claimed)
		}
		if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(claimed[0], mappedBody(claimed[0]))}); err != nil {
			t.Fatal(err)
		}
		if b.row(t, id).Status != "PENDING" {
			break
		}
		if attempt > 3 {
			t.Fatal("row still PENDING after max_attempts")
		}
	}

	got := b.row(t, id)
	if got.Status != "FAILED" || got.AttemptCount != 3 || got.Due != nil {
		t.Fatalf("row: %s after %d attempts, due %v; want FAILED after 3", got.Status, got.AttemptCount, got.Due)
	}
	if !strings.HasPrefix(str(got.LastError), `giving up after 3 attempts: http 200: {"result":1,"errcode":"999"}`) {
		t.Errorf("last_error = %q", str(got.LastError))
	}
	if n := len(b.platform.received()); n != 3 {
		t.Errorf("platform received %d requests, want 3", n)
	}
	for _, r := range b.platform.received() {
		if r.path != "/mch/heartbeat" {
			t.Errorf("heartbeat posted to %s, want /mch/heartbeat", r.path)
		}
	}
	wantStatus := []string{"PENDING", "PENDING", "FAILED"}
	// Delays: initial 1s × 2^(attempt−1) ± 10 %.
	wantRetry := [][2]time.Duration{{900 * time.Millisecond, 1100 * time.Millisecond}, {1800 * time.Millisecond, 2200 * time.Millisecond}}
	if len(got.Logs) != 3 {
		t.Fatalf("log rows: %+v, want 3", got.Logs)
	}
	for i, l := range got.Logs {
		if l.Attempt != i+1 || l.Status != wantStatus[i] || str(l.Errcode) != "999" {
			t.Errorf("log %d: attempt %d %s errcode %s, want %d %s 999", i, l.Attempt, l.Status, str(l.Errcode), i+1, wantStatus[i])
		}
		if i < 2 && (l.RetryIn == nil || *l.RetryIn < wantRetry[i][0] || *l.RetryIn > wantRetry[i][1]) {
			t.Errorf("log %d: retry in %v, want within %v", i, l.RetryIn, wantRetry[i])
		}
	}
}

// TestOneAttemptFailsAMessageOnlyOnceSeenFailingOnItsOwn: with
// max_attempts 1, a message the platform answers 500 while it answers the
// others is sent twice. Its first failure cannot be told from an outage
// beginning, so it counts no attempt; once a request sent after it was
// answered, its second failure is its own and ends it FAILED
// (docs/architecture.md, "No row FAILED by an outage").
func TestOneAttemptFailsAMessageOnlyOnceSeenFailingOnItsOwn(t *testing.T) {
	t.Parallel()
	var bad atomic.Value // the failing message's key
	bad.Store("")
	b := setup(t, setupOpts{
		extra: "retry:\n  initial: 1s\n  max: 10s\n  max_attempts: 1",
		handler: func(w http.ResponseWriter, r *http.Request, body []byte) {
			if key := bad.Load().(string); key != "" && strings.Contains(string(body), key) {
				reply(500, "cannot handle this one")(w, r, body)
				return
			}
			reply(200, `{"result":0}`)(w, r, body)
		},
	})
	send := func(r outboxdb.Record) {
		t.Helper()
		if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(r, mappedBody(r))}); err != nil {
			t.Fatal(err)
		}
	}
	rows := b.claim(t, 2, outboxdb.APITypeVehicleEvent)
	good, failing := rows[0], rows[1]
	bad.Store(failing.MessageKey)
	send(good)
	send(failing)
	got := b.row(t, failing.ID)
	if got.Status != "PENDING" || got.AttemptCount != 0 || !strings.HasPrefix(str(got.LastError), "platform unavailable, attempt not counted: http 500") {
		t.Fatalf("after its first failure: %s, %d attempts, %q; want PENDING with its attempt not counted", got.Status, got.AttemptCount, str(got.LastError))
	}

	send(b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]) // answered after the failure
	b.makeDue(t, failing.ID)
	again := b.claimDue(t, 1)
	if len(again) != 1 || again[0].ID != failing.ID {
		t.Fatalf("claimed %+v, want row %d", again, failing.ID)
	}
	send(again[0])
	got = b.row(t, failing.ID)
	if got.Status != "FAILED" || got.AttemptCount != 1 || !strings.HasPrefix(str(got.LastError), "giving up after 1 attempts: http 500") {
		t.Fatalf("after its second failure: %s, %d attempts, %q; want FAILED after 1 attempt", got.Status, got.AttemptCount, str(got.LastError))
	}
	sent := 0
	for _, r := range b.platform.received() {
		if strings.Contains(string(r.body), failing.MessageKey) {
			sent++
		}
	}
	if sent != 2 || len(got.Logs) != 2 || got.Logs[0].Status != "PENDING" || got.Logs[1].Status != "FAILED" {
		t.Fatalf("the platform got the message %d times, attempt log %+v; want twice, PENDING then FAILED", sent, got.Logs)
	}

	// Requeued, the message is new again: that the platform answered
	// others since the requeue says nothing of it (at the start of an
	// outage those are the requests sent before it), so its first failure
	// after the requeue counts no attempt either. The same instance takes
	// the retry a moment after it saw the message fail on its own: neither
	// the row nor its memory may take that failure for the new message's.
	if n, err := outboxdb.Requeue(b.ctx, b.pool, outboxdb.RequeueFilter{Keys: []string{failing.MessageKey}}, outboxdb.RequeueOptions{}); err != nil || n != 1 {
		t.Fatalf("requeued %d rows (err %v), want 1", n, err)
	}
	requeued := b.claimDue(t, 1)
	if len(requeued) != 1 || requeued[0].ID != failing.ID {
		t.Fatalf("claimed %+v, want the requeued row %d", requeued, failing.ID)
	}
	send(b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]) // answered after the requeue
	send(requeued[0])
	got = b.row(t, failing.ID)
	if got.Status != "PENDING" || got.AttemptCount != 0 || !strings.HasPrefix(str(got.LastError), "platform unavailable, attempt not counted: http 500") {
		t.Fatalf("after its first failure since the requeue: %s, %d attempts, %q; want PENDING with its attempt not counted", got.Status, got.AttemptCount, str(got.LastError))
	}
}

// TestNotSent covers the messages the output must record without a request.
func TestNotSent(t *testing.T) {
	t.Parallel()

	t.Run("MappingErrorIsFailedAndCounted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
		msg := message(r, `{"raw":"payload as received"}`)
		msg.SetError(errors.New("inoutType 7 is not 0 or 1"))
		if err := b.out.WriteBatch(b.ctx, service.MessageBatch{msg}); err != nil {
			t.Fatal(err)
		}
		got := b.row(t, r.ID)
		if got.Status != "FAILED" || str(got.LastError) != "mapping: inoutType 7 is not 0 or 1" || got.HTTPStatus != nil {
			t.Fatalf("row: %s %q http %s", got.Status, str(got.LastError), num(got.HTTPStatus))
		}
		if len(got.Logs) != 1 || got.Logs[0].Status != "FAILED" || str(got.Logs[0].Error) != "mapping: inoutType 7 is not 0 or 1" || got.Logs[0].DurationMs != nil {
			t.Fatalf("log rows: %+v", got.Logs)
		}
		if n := len(b.platform.received()); n != 0 {
			t.Errorf("a message with a mapping error was sent %d times", n)
		}
	})

	t.Run("BodyThatIsNotAnObjectIsFailed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
		if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(r, `["not","an","object"]`)}); err != nil {
			t.Fatal(err)
		}
		if got := b.row(t, r.ID); got.Status != "FAILED" || !strings.Contains(str(got.LastError), "mapping: the mapped body is not a JSON object") {
			t.Fatalf("row: %s %q", got.Status, str(got.LastError))
		}
		if n := len(b.platform.received()); n != 0 {
			t.Errorf("sent %d requests", n)
		}
	})

	t.Run("TooLittleLeaseGoesBackDueNowAtMostThreeTimes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{extra: "timeout: 5s"})
		r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
		for round := 1; round <= outboxdb.MaxLeaseReturns+1; round++ {
			if round > 1 {
				b.makeDue(t, r.ID)
				r = b.claimDue(t, 1)[0]
			}
			msg := message(r, mappedBody(r))
			// The claim ends before a request and its result could be made,
			// and no dispatcher renews it: just under the least lease a
			// request is sent on, all of it left for the give-back's write
			// (500 ms was too little for it under the race detector on a
			// loaded machine).
			msg.MetaSetMut(msgmeta.LeaseExpiresAtMs, time.Now().Add(resultMargin+minRequest-50*time.Millisecond).UnixMilli())
			if err := b.out.WriteBatch(b.ctx, service.MessageBatch{msg}); err != nil {
				t.Fatal(err)
			}
			got := b.row(t, r.ID)
			if round <= outboxdb.MaxLeaseReturns {
				if got.Status != "PENDING" || got.Due == nil || *got.Due > 0 || got.AttemptCount != 0 || len(got.Logs) != 0 {
					t.Fatalf("give-back %d: %s due in %v after %d attempts, logs %+v; want PENDING due now, the claim undone",
						round, got.Status, got.Due, got.AttemptCount, got.Logs)
				}
				continue
			}
			// Past the bound the give-back counts: the row cannot be
			// returned unsent forever.
			if got.Status != "PENDING" || got.AttemptCount != 1 || len(got.Logs) != 1 {
				t.Fatalf("give-back %d: %s after %d attempts, logs %+v; want the attempt counted and logged", round, got.Status, got.AttemptCount, got.Logs)
			}
		}
		if n := len(b.platform.received()); n != 0 {
			t.Errorf("sent %d requests on claims about to expire", n)
		}
		// One warning for the burst, not one per row.
		if n := strings.Count(b.logs.String(), `level=WARN msg="not sent: the claim lease ends in`); n != 1 {
			t.Errorf("%d warnings about unsent claims, want 1 per burst:\n%s", n, b.logs.String())
		}
	})

	t.Run("StoppingGivesBackTheWaitingAndCountsTheCutShort", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 2)
		b := setup(t, setupOpts{extra: "max_in_flight: 1\ntimeout: 5s", handler: func(w http.ResponseWriter, r *http.Request, _ []byte) {
			arrived <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}})
		rows := b.claim(t, 2, outboxdb.APITypeVehicleEvent)
		ctx, stop := context.WithCancel(b.ctx)
		defer stop()
		written := make(chan error, 1)
		go func() {
			written <- b.out.WriteBatch(ctx, service.MessageBatch{message(rows[0], mappedBody(rows[0])), message(rows[1], mappedBody(rows[1]))})
		}()
		// The first request is at the platform and holds the only slot;
		// the second row waits for it. Then the output stops.
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("no request reached the platform")
		}
		stop()
		select {
		case err := <-written:
			if err != nil {
				t.Fatalf("WriteBatch while stopping: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WriteBatch did not return after the output stopped")
		}
		// The request cut short may have reached the platform: its attempt
		// counts and is logged, and the row is due again at once.
		cut := b.row(t, rows[0].ID)
		if cut.Status != "PENDING" || cut.AttemptCount != 1 || len(cut.Logs) != 1 || cut.Due == nil || *cut.Due > 0 ||
			!strings.Contains(str(cut.LastError), "the output stopped during the request") {
			t.Errorf("row cut short: %s, %d attempts, due in %v, logs %+v, last error %q; want PENDING due now, the attempt counted and logged",
				cut.Status, cut.AttemptCount, cut.Due, cut.Logs, str(cut.LastError))
		}
		// The row that never got a slot was not sent: given back, its
		// claim undone, nothing logged.
		waiting := b.row(t, rows[1].ID)
		if waiting.Status != "PENDING" || waiting.AttemptCount != 0 || len(waiting.Logs) != 0 || waiting.Due == nil || *waiting.Due > 0 {
			t.Errorf("row waiting for a slot: %s, %d attempts, due in %v, logs %+v; want PENDING due now, the claim undone",
				waiting.Status, waiting.AttemptCount, waiting.Due, waiting.Logs)
		}
		if n := len(b.platform.received()); n != 1 {
			t.Errorf("%d requests reached the platform, want 1", n)
		}
		if !strings.Contains(b.logs.String(), "not sent: the output is stopping") {
			t.Errorf("no warning about the row given back:\n%s", b.logs.String())
		}
	})

	t.Run("ShortLeaseCutsTheRequest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{extra: "timeout: 5s", handler: func(w http.ResponseWriter, r *http.Request, _ []byte) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}})
		r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
		msg := message(r, mappedBody(r))
		msg.MetaSetMut(msgmeta.LeaseExpiresAtMs, time.Now().Add(1500*time.Millisecond).UnixMilli())
		start := time.Now()
		if err := b.out.WriteBatch(b.ctx, service.MessageBatch{msg}); err != nil {
			t.Fatal(err)
		}
		got := b.row(t, r.ID)
		if got.Status != "PENDING" || got.AttemptCount != 1 || !strings.Contains(str(got.LastError), "request timed out after") {
			t.Fatalf("row %s, %d attempts, last error %q; want a timed-out attempt", got.Status, got.AttemptCount, str(got.LastError))
		}
		// The request was cut to the lease left (minus the time kept for the
		// result), not given the whole 5s timeout.
		if took := time.Since(start); took >= 5*time.Second {
			t.Errorf("the request took %v: it was not cut to the lease", took)
		}
	})

	t.Run("MissingClaimMetadataIsNackedAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		r := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
		batch := service.MessageBatch{service.NewMessage([]byte(`{"a":1}`)), message(r, mappedBody(r))}
		index := batch.Index()
		err := b.out.WriteBatch(b.ctx, batch)
		var berr *service.BatchError
		if !errors.As(err, &berr) || berr.IndexedErrors() != 1 {
			t.Fatalf("WriteBatch = %v, want a batch error for the stray message only", err)
		}
		// The nack's error is what the rows' last_error will say.
		if !strings.Contains(err.Error(), "metadata outbox_id is missing") {
			t.Errorf("WriteBatch = %v, want it to say what is missing", err)
		}
		berr.WalkMessagesIndexedBy(index, func(i int, _ *service.Message, err error) bool {
			if i == 0 && (err == nil || !strings.Contains(err.Error(), "metadata outbox_id is missing")) {
				t.Errorf("stray message error: %v", err)
			}
			if i == 1 && err != nil {
				t.Errorf("claimed message nacked: %v", err)
			}
			return true
		})
		if got := b.row(t, r.ID); got.Status != "SUCCESS" {
			t.Fatalf("claimed row: %s, want SUCCESS", got.Status)
		}
	})
}

// TestStaleClaimChangesNothing: a holder whose lease ran out and whose row
// was claimed again writes its late result; the row keeps the new claim.
func TestStaleClaimChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{handler: reply(200, `{"result":0}`)})
	old := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
	if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	current := b.claimDue(t, 1)[0]
	before := b.row(t, old.ID)

	if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(old, mappedBody(old))}); err != nil {
		t.Fatal(err)
	}
	after := b.row(t, old.ID)
	if after.Status != "IN_PROGRESS" || after.ClaimToken != current.ClaimToken || after.Succeeded ||
		after.HTTPStatus != nil || len(after.Logs) != len(before.Logs) {
		t.Fatalf("stale result changed the row: before %+v, after %+v", before, after)
	}
	if !strings.Contains(b.logs.String(), "the claim was lost") {
		t.Errorf("no warning about the lost claim in the log:\n%s", b.logs.String())
	}
}

// TestCredentials: the credentials lead every request body and appear
// nowhere else, even when the platform echoes them back.
func TestCredentials(t *testing.T) {
	t.Parallel()
	echo := func(w http.ResponseWriter, _ *http.Request, body []byte) {
		w.WriteHeader(500)
		_, _ = w.Write(body)
	}
	b := setup(t, setupOpts{handler: echo})
	rows := b.claim(t, 3, outboxdb.APITypeVehicleEvent)
	batch := service.MessageBatch{
		message(rows[0], mappedBody(rows[0])),
		message(rows[1], ` {  }`),
		message(rows[2], `{"x":1}`),
	}
	batch[2].SetError(errors.New("bad field near " + testAccessPwd))
	if err := b.out.WriteBatch(b.ctx, batch); err != nil {
		t.Fatal(err)
	}

	reqs := b.platform.received()
	if len(reqs) != 2 {
		t.Fatalf("platform received %d requests, want 2", len(reqs))
	}
	wantPrefix := `{"access_name":"acc-N4ME-\"q\"-7f3e","access_pwd":"pwd-S3CRET-\u003c9b2e\u003e"`
	for _, r := range reqs {
		if !strings.HasPrefix(string(r.body), wantPrefix) {
			t.Errorf("request body %s does not start with the credentials", r.body)
		}
		var obj map[string]any
		if err := json.Unmarshal(r.body, &obj); err != nil {
			t.Errorf("request body %s is not JSON: %v", r.body, err)
		}
		if obj["access_name"] != testAccessName || obj["access_pwd"] != testAccessPwd {
			t.Errorf("credentials in body: %v %v", obj["access_name"], obj["access_pwd"])
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q", ct)
		}
	}

	secrets := []string{testAccessName, testAccessPwd, `acc-N4ME-\"q\"-7f3e`, `pwd-S3CRET-\u003c9b2e\u003e`, "N4ME", "S3CRET"}
	var stored []string
	for _, r := range rows {
		got := b.row(t, r.ID)
		stored = append(stored, str(got.LastError))
		for _, l := range got.Logs {
			stored = append(stored, str(l.Error))
		}
	}
	stored = append(stored, b.logs.String())
	for _, text := range stored {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("secret %q leaked into %q", s, text)
			}
		}
	}
	if !strings.Contains(stored[0], "[redacted]") {
		t.Errorf("echoed body not redacted in last_error: %q", stored[0])
	}
}

// TestSemaphoreBoundsRequests: concurrent batches never have more than
// max_in_flight requests in flight, and every slot is free again after.
func TestSemaphoreBoundsRequests(t *testing.T) {
	t.Parallel()
	const maxInFlight = 3
	var (
		inFlight, peak = make(chan struct{}, 100), 0
		gate           = make(chan struct{})
	)
	handler := func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		inFlight <- struct{}{}
		<-gate
		<-inFlight
		_, _ = w.Write([]byte(`{"result":0}`))
	}
	b := setup(t, setupOpts{handler: handler, extra: "max_in_flight: 3"})
	rows := b.claim(t, 8, outboxdb.APITypeVehicleEvent)

	errs := make(chan error, 2)
	for _, part := range [][]outboxdb.Record{rows[:4], rows[4:]} {
		var batch service.MessageBatch
		for _, r := range part {
			batch = append(batch, message(r, mappedBody(r)))
		}
		go func() { errs <- b.out.WriteBatch(b.ctx, batch) }()
	}
	// Release requests one at a time once the slots are full.
	for released := 0; released < len(rows); released++ {
		deadline := time.After(10 * time.Second)
		for len(inFlight) < min(maxInFlight, len(rows)-released) {
			select {
			case <-deadline:
				t.Fatalf("only %d requests in flight", len(inFlight))
			case <-time.After(time.Millisecond):
			}
		}
		peak = max(peak, len(inFlight))
		if free := b.out.gate.Limiter().Limit() - b.out.gate.Limiter().InFlight(); free != 0 && len(rows)-released >= maxInFlight {
			t.Errorf("free slots = %d with %d requests held", free, len(inFlight))
		}
		gate <- struct{}{}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if peak != maxInFlight {
		t.Errorf("peak in flight = %d, want %d", peak, maxInFlight)
	}
	if free := b.out.gate.Limiter().Limit() - b.out.gate.Limiter().InFlight(); free != maxInFlight {
		t.Errorf("free slots after = %d, want %d", free, maxInFlight)
	}
	for _, r := range rows {
		if got := b.row(t, r.ID); got.Status != "SUCCESS" {
			t.Errorf("row %d: %s", r.ID, got.Status)
		}
	}
}
