package httpforwarder

import (
	stdjson "encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
)

// TestDecide is the policy of a claim, decided without a database or a
// server: the reply table of the platform's contract (every class of reply,
// on a middle attempt and on the last one, with what it tells the
// platform's protection), what a reply whose attempt the protection does
// not count becomes (NotCounted), and how long a request may take for the
// lease its claim has left (RequestBudget).
func TestDecide(t *testing.T) {
	t.Parallel()
	rules, err := compileRules(defaultRules)
	if err != nil {
		t.Fatal(err)
	}
	p := policy{
		rules:       rules,
		backoff:     backoff{initial: time.Second, max: 10 * time.Second, multiplier: 2, jitter: 0.1},
		maxAttempts: 3,
		timeout:     10 * time.Second,
		rnd:         func() float64 { return 0.5 }, // no jitter
	}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	json := func(status int, body string) response {
		r := response{Status: status, Snippet: body}
		var v any
		if body != "" {
			v = decodeJSON(t, body)
		}
		r.Body = v
		return r
	}
	for _, tc := range []struct {
		name     string
		r        response
		attempt  int
		status   outboxdb.Status
		class    outboxdb.FailureClass
		retryIn  time.Duration
		health   health
		errcode  string
		errHas   string
		pauseFor time.Duration
		// overloaded: the reply halves the concurrency limit.
		overloaded bool
	}{
		{name: "Result0", r: json(200, `{"result":0}`), attempt: 1, status: outboxdb.StatusSuccess, health: healthy},
		{name: "Result0AsString", r: json(201, `{"result":"0","errcode":"0"}`), attempt: 3, status: outboxdb.StatusSuccess, health: healthy, errcode: "0"},
		{name: "Errcode4IsDuplicate", r: json(200, `{"result":1,"errcode":"4"}`), attempt: 3, status: outboxdb.StatusSuccess, health: healthy, errcode: "4"},
		{name: "Errcode4NumberIsDuplicate", r: json(200, `{"result":1,"errcode":4}`), attempt: 1, status: outboxdb.StatusSuccess, health: healthy, errcode: "4"},
		{name: "Errcode998IsRejected", r: json(200, `{"result":1,"errcode":"998"}`), attempt: 1, status: outboxdb.StatusFailed, class: outboxdb.ClassRejected,
			health: healthy, errcode: "998", errHas: "not retried (rules[1] no_retry)"},
		{name: "Errcode999IsRetried", r: json(200, `{"result":1,"errcode":"999"}`), attempt: 1, status: outboxdb.StatusPending,
			retryIn: time.Second, health: healthy, errcode: "999", errHas: `http 200: {"result":1,"errcode":"999"}`},
		{name: "Errcode999OnTheLastAttemptFails", r: json(200, `{"result":1,"errcode":"999"}`), attempt: 3, status: outboxdb.StatusFailed,
			class: outboxdb.ClassTransient, health: healthy, errcode: "999", errHas: "giving up after 3 attempts"},
		{name: "SecondRetryDoubles", r: json(200, `{"result":2}`), attempt: 2, status: outboxdb.StatusPending, retryIn: 2 * time.Second, health: healthy},
		{name: "HTTP500", r: response{Status: 500, Snippet: "oops"}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable, errHas: "http 500: oops"},
		{name: "HTTP500WithSuccessBody", r: json(500, `{"result":0}`), attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable},
		{name: "HTTP429RetryAfter", r: response{Status: 429, RetryAfter: "7"}, attempt: 1, status: outboxdb.StatusPending,
			retryIn: 7 * time.Second, health: unavailable, pauseFor: 7 * time.Second, errHas: "http 429 (empty body)", overloaded: true},
		{name: "HTTP503RetryAfterCapped", r: response{Status: 503, RetryAfter: "3600"}, attempt: 1, status: outboxdb.StatusPending,
			retryIn: 10 * time.Second, health: unavailable, pauseFor: 10 * time.Second, overloaded: true},
		{name: "HTTP503RetryAfterAsDate", r: response{Status: 503, RetryAfter: now.Add(4 * time.Second).Format(httpDate)}, attempt: 1,
			status: outboxdb.StatusPending, retryIn: 4 * time.Second, health: unavailable, pauseFor: 4 * time.Second, overloaded: true},
		{name: "RetryAfterIgnoredOn500", r: response{Status: 500, RetryAfter: "7"}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable},
		{name: "NonJSON2xx", r: response{Status: 200, Snippet: "<html>maintenance</html>"}, attempt: 1, status: outboxdb.StatusPending,
			retryIn: time.Second, health: unavailable, errHas: "http 200: <html>maintenance</html>"},
		{name: "Timeout", r: response{Err: "request timed out after 10s", TimedOut: true}, attempt: 1, status: outboxdb.StatusPending,
			retryIn: time.Second, health: unavailable, errHas: "request timed out after 10s", overloaded: true},
		{name: "ConnectionRefused", r: response{Err: "dial tcp: connection refused"}, attempt: 3, status: outboxdb.StatusFailed,
			class: outboxdb.ClassTransient, health: unavailable, errHas: "giving up after 3 attempts: dial tcp: connection refused", overloaded: true},
		{name: "HTTP502", r: response{Status: 502}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable, overloaded: true},
		{name: "HTTP504", r: response{Status: 504}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable, overloaded: true},
		{name: "HTTP400IsHealthyAndRetried", r: json(400, `{"error":"bad field"}`), attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: healthy},
		{name: "EmptyBody", r: response{Status: 204}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second, health: unavailable, errHas: "http 204 (empty body)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var told protection.Reply
			d := p.decide(tc.r, try{attempt: tc.attempt, took: 20 * time.Millisecond, now: now}, func(rep protection.Reply) bool {
				told = rep
				return true
			})
			r := d.Result
			want := protection.Reply{Unavailable: tc.health == unavailable, Fresh: tc.attempt <= 1, Last: tc.attempt == 3, Overloaded: tc.overloaded, PauseFor: tc.pauseFor, Why: r.Error, Attempt: tc.attempt}
			if told != want {
				t.Errorf("told the protection %+v, want %+v", told, want)
			}
			if r.Status != tc.status || r.Class != tc.class || d.Health != tc.health || r.PlatformErrcode != tc.errcode {
				t.Fatalf("status %s class %q health %v errcode %q; want %s %q %v %q (outcome %s, error %q)",
					r.Status, r.Class, d.Health, r.PlatformErrcode, tc.status, tc.class, tc.health, tc.errcode, d.Outcome, r.Error)
			}
			if r.Status == outboxdb.StatusPending && r.RetryIn != tc.retryIn {
				t.Errorf("retry in %v, want %v", r.RetryIn, tc.retryIn)
			}
			if d.Overloaded != tc.overloaded {
				t.Errorf("overloaded %v, want %v", d.Overloaded, tc.overloaded)
			}
			if d.PauseFor != tc.pauseFor {
				t.Errorf("pause %v, want %v", d.PauseFor, tc.pauseFor)
			}
			if tc.errHas != "" && !strings.Contains(r.Error, tc.errHas) {
				t.Errorf("error %q, want it to contain %q", r.Error, tc.errHas)
			}
			if r.Status == outboxdb.StatusSuccess && r.Error != "" {
				t.Errorf("a success carries an error: %q", r.Error)
			}
			if !r.Sent || r.HTTPStatus != tc.r.Status {
				t.Errorf("sent %v http %d", r.Sent, r.HTTPStatus)
			}
		})
	}

	// A reply whose attempt the protection does not count (the platform is
	// down, or the request was a probe) leaves the row's attempts as they
	// were when it would have spent the last one, or always for a probe
	// (docs/guarantees.md #13).
	t.Run("NotCounted", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			r       response
			attempt int
			probe   bool
			// undone: the attempt is given back (Undo) and the row waits
			// retryIn with its attempts as they were.
			undone  bool
			status  outboxdb.Status
			retryIn time.Duration
		}{
			{name: "LastAttemptOfADownPlatform", r: response{Status: 503}, attempt: 3, undone: true, status: outboxdb.StatusPending, retryIn: 4 * time.Second},
			{name: "LastAttemptPausedByRetryAfter", r: response{Status: 503, RetryAfter: "6"}, attempt: 3, undone: true, status: outboxdb.StatusPending, retryIn: 6 * time.Second},
			{name: "EarlierAttemptCountsAsARetry", r: response{Status: 503}, attempt: 1, status: outboxdb.StatusPending, retryIn: time.Second},
			{name: "FailedProbe", r: response{Err: "connection refused"}, attempt: 1, probe: true, undone: true, status: outboxdb.StatusPending, retryIn: time.Second},
			{name: "HealthyProbeIsRecorded", r: response{Status: 200, Body: map[string]any{"result": 0.0}}, attempt: 1, probe: true, status: outboxdb.StatusSuccess},
			{name: "HealthyFailureOnTheLastAttemptFails", r: response{Status: 200, Body: map[string]any{"result": 1.0, "errcode": "999"}}, attempt: 3, status: outboxdb.StatusFailed},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				d := p.decide(tc.r, try{attempt: tc.attempt, probe: tc.probe, took: time.Millisecond, now: now}, func(protection.Reply) bool { return false })
				r := d.Result
				if r.Status != tc.status || r.Undo != tc.undone || r.Logged != tc.undone {
					t.Fatalf("status %s undo %v logged %v (error %q); want %s, undone %v", r.Status, r.Undo, r.Logged, r.Error, tc.status, tc.undone)
				}
				if r.Status == outboxdb.StatusPending && r.RetryIn != tc.retryIn {
					t.Errorf("retry in %v, want %v", r.RetryIn, tc.retryIn)
				}
				if tc.undone && (!strings.HasPrefix(r.Error, "platform unavailable, attempt not counted: ") || r.Class != "") {
					t.Errorf("error %q class %q", r.Error, r.Class)
				}
			})
		}
	})

	// The protection learns what it needs of the row: whether its
	// attempts were unspent, whether this one is its last, which one it
	// is, and when it last failed on any instance.
	t.Run("ReportsTheRowsPreviousFailure", func(t *testing.T) {
		t.Parallel()
		failed := now.Add(-300 * time.Millisecond)
		var got protection.Reply
		p.decide(response{Status: 503}, try{attempt: 2, previousFailure: failed, took: time.Millisecond, now: now},
			func(r protection.Reply) bool { got = r; return true })
		if !got.Unavailable || got.Fresh || got.Last || got.Attempt != 2 || !got.PreviousFailure.Equal(failed) {
			t.Fatalf("reported %+v, want an unavailable reply to attempt 2 of a row that failed before, at %v, with an attempt left", got, failed)
		}
		p.decide(response{Status: 503}, try{attempt: 3, previousFailure: failed, took: time.Millisecond, now: now},
			func(r protection.Reply) bool { got = r; return true })
		if !got.Last {
			t.Fatalf("reported %+v for the row's last attempt (3 of 3), want Last", got)
		}
	})

	// How long a request may take, or why it is not made, from what is
	// known of its claim's lease (docs/guarantees.md #12).
	t.Run("RequestBudget", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			lease claimLease
			want  time.Duration
			why   notSent
		}{
			{name: "LostClaimIsNotSent", lease: claimLease{lost: true, renewing: true}, why: lostClaim},
			{name: "RenewedLeaseGivesTheWholeTimeout", lease: claimLease{renewing: true, ends: now.Add(time.Second)}, want: 10 * time.Second},
			{name: "UnknownLeaseGivesTheWholeTimeout", want: 10 * time.Second},
			{name: "LongLeaseGivesTheWholeTimeout", lease: claimLease{ends: now.Add(time.Minute)}, want: 10 * time.Second},
			{name: "ShortLeaseCutsTheRequest", lease: claimLease{ends: now.Add(3 * time.Second)}, want: 2 * time.Second},
			{name: "JustEnoughLeaseSends", lease: claimLease{ends: now.Add(resultMargin + minRequest)}, want: minRequest},
			{name: "TooLittleLeaseGoesBack", lease: claimLease{ends: now.Add(resultMargin + minRequest - time.Millisecond)}, why: shortLease},
			{name: "EndedLeaseGoesBack", lease: claimLease{ends: now.Add(-time.Second)}, why: shortLease},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				if got, why := p.requestBudget(tc.lease, now); got != tc.want || why != tc.why {
					t.Fatalf("budget %v (%d), want %v (%d)", got, why, tc.want, tc.why)
				}
			})
		}
	})
}

// TestMessageSpecificRule: a reply a rule calls message-specific shows the
// platform up whatever its status, so it never counts toward the breaker,
// never halves concurrency, and its attempts count to FAILED.
func TestMessageSpecificRule(t *testing.T) {
	t.Parallel()
	rules, err := compileRules(append([]ruleSpec{{When: `status == 500 && body?.error == "bad plate"`, Outcome: outcomeRetry, MessageSpecific: true}}, defaultRules...))
	if err != nil {
		t.Fatal(err)
	}
	p := policy{rules: rules, backoff: backoff{initial: time.Second, max: 10 * time.Second, multiplier: 2}, maxAttempts: 3, rnd: func() float64 { return 0.5 }}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	bad := response{Status: 500, Body: map[string]any{"error": "bad plate"}, Snippet: `{"error":"bad plate"}`}
	counted := func(protection.Reply) bool { return true }
	d := p.decide(bad, try{attempt: 3, took: time.Millisecond, now: now}, counted)
	if d.Health != healthy || d.Overloaded || d.Result.Status != outboxdb.StatusFailed || d.Result.Class != outboxdb.ClassTransient {
		t.Fatalf("message-specific 500 on the last attempt: health %v overloaded %v status %s class %q; want healthy, FAILED TRANSIENT",
			d.Health, d.Overloaded, d.Result.Status, d.Result.Class)
	}
	other := response{Status: 500, Body: map[string]any{"error": "database down"}}
	if d := p.decide(other, try{attempt: 1, took: time.Millisecond, now: now}, counted); d.Health != unavailable {
		t.Fatalf("a 500 the rule does not match: health %v, want unavailable", d.Health)
	}
}

const httpDate = "Mon, 02 Jan 2006 15:04:05 GMT"

func decodeJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := stdjson.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}
