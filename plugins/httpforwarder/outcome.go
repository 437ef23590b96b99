package httpforwarder

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
)

// policy decides what happens to a claimed row: how long its request may
// take (requestBudget), and what the reply means for the row and for the
// platform's protection (decide): the rules decide the outcome, the retry
// schedule the delay, max attempts the end. It does no I/O, so every case
// is tested without a database or a server (outcome_test.go).
type policy struct {
	rules       ruleSet
	backoff     backoff
	maxAttempts int
	// timeout bounds one request.
	timeout time.Duration
	// rnd places a delay within the jitter band; uniform in [0, 1).
	rnd func() float64
}

const (
	// resultMargin is the lease kept, beyond a request, for writing its
	// result when leases are not being renewed: a request is cut to the
	// lease left minus this, so that a slow reply recorded late does not
	// lose its claim to another instance that would send the message again.
	resultMargin = time.Second
	// minRequest is the shortest request worth making: with less lease left
	// than this plus resultMargin, the claim is given back unsent.
	minRequest = 100 * time.Millisecond
)

// claimLease is what is known of a claim's lease as its request is about
// to go.
type claimLease struct {
	// lost: the dispatcher found the claim taken by another instance.
	lost bool
	// renewing: the dispatcher holds the claim and renews its lease.
	renewing bool
	// ends is when the lease ends; zero when unknown.
	ends time.Time
}

// notSent says why a request is not made.
type notSent int

const (
	sendIt notSent = iota
	// lostClaim: the row is another's now; its result is not written here.
	lostClaim
	// shortLease: too little lease is left for a request and its result,
	// and it cannot be renewed; the claim goes back unsent.
	shortLease
)

// requestBudget says how long the request of a claim with lease l may take
// at now. While the lease is renewed (or its end is unknown) the request may
// take the whole timeout; otherwise it is cut to the lease left minus the
// time kept for writing the result, and not made at all when that is too
// short (docs/guarantees.md #12).
func (p policy) requestBudget(l claimLease, now time.Time) (time.Duration, notSent) {
	switch {
	case l.lost:
		return 0, lostClaim
	case l.renewing, l.ends.IsZero():
		return p.timeout, sendIt
	}
	left := l.ends.Sub(now) - resultMargin
	if left < minRequest {
		return 0, shortLease
	}
	return min(p.timeout, left), sendIt
}

// try is one request as decide sees it.
type try struct {
	// attempt is the row's attempt number (1-based).
	attempt int
	// probe: the request carried the probe of an open breaker.
	probe bool
	// previousFailure is when the row last failed, on any instance (zero:
	// it has not).
	previousFailure time.Time
	took            time.Duration
	now             time.Time
}

// health is what a reply says about the platform itself, whatever it says
// about the row: a reply the platform produced on purpose (any JSON answer,
// any errcode, any 4xx but 429, a reply a rule settles as success,
// duplicate or no_retry, or one a rule calls message-specific) shows it up; no reply, a timeout, a 5xx, a 429 or a 2xx that is not JSON
// shows it unavailable (docs/architecture.md, "Protecting the platform").
type health int

const (
	healthy health = iota
	unavailable
)

func (h health) String() string {
	if h == unavailable {
		return "unavailable"
	}
	return "healthy"
}

// decision is what one reply means for its row.
type decision struct {
	// Outcome is the rule outcome (success, duplicate, no_retry, retry).
	Outcome string
	// Result is the row's new state, ready for outboxdb.RecordResults but
	// for the claim (ID, ClaimToken).
	Result outboxdb.Result
	// Health of the platform as this reply shows it.
	Health health
	// Overloaded: the reply asks for less (429, 502, 503, 504) or none came
	// in time; only then is the concurrency limit halved.
	Overloaded bool
	// PauseFor is the Retry-After of a 429/503, capped at the retry
	// maximum: every instance should stop sending that long. Zero when none.
	PauseFor time.Duration
	// RuleErr is a rule that failed to run (for debugging), or nil.
	RuleErr error
}

// decide classifies r, the reply to request t. report tells the platform's
// protection what the reply says about the platform, and answers whether
// the row's attempt may count (protection.Ticket.Finish); when it may not,
// an unavailable reply does not spend the attempt (notCounted).
func (p policy) decide(r response, t try, report func(protection.Reply) (counted bool)) decision {
	d := p.classify(r, t.attempt, t.took, t.now)
	counted := report(protection.Reply{
		Unavailable:     d.Health == unavailable,
		Fresh:           t.attempt <= 1,
		Last:            p.lastAttempt(t.attempt),
		Overloaded:      d.Overloaded,
		PauseFor:        d.PauseFor,
		Why:             d.Result.Error,
		PreviousFailure: t.previousFailure,
		Attempt:         t.attempt,
	})
	if !counted {
		d = p.notCounted(d, r, t.attempt, t.probe)
	}
	return d
}

// lastAttempt says whether attempt is the row's last: failed, it ends the
// row FAILED.
func (p policy) lastAttempt(attempt int) bool { return attempt >= p.maxAttempts }

// classify is what r says by the rules, before the protection's verdict.
func (p policy) classify(r response, attempt int, took time.Duration, now time.Time) decision {
	env := ruleEnv{Status: r.Status, Headers: r.Headers, Body: r.Body, Error: r.Err}
	rule, ruleIdx, runErr := p.rules.classify(&env)
	outcome := rule.Outcome
	d := decision{
		Outcome:    outcome,
		Health:     replyHealth(r),
		Overloaded: overloaded(r),
		RuleErr:    runErr,
		Result: outboxdb.Result{
			Sent:            true,
			Duration:        took,
			HTTPStatus:      r.Status,
			PlatformErrcode: platformErrcode(r.Body),
		},
	}
	if rule.MessageSpecific || outcome != outcomeRetry {
		// A rule that settles the row (success, duplicate, no_retry) or
		// says the reply concerns its message took it as the platform's
		// answer: it is not an outage, and its attempt counts.
		d.Health, d.Overloaded = healthy, false
	}
	if honoursRetryAfter(r.Status) {
		if wait, ok := retryAfter(r.RetryAfter, now); ok {
			d.PauseFor = min(wait, p.backoff.max)
		}
	}
	switch outcome {
	case outcomeSuccess, outcomeDuplicate:
		d.Result.Status = outboxdb.StatusSuccess
		return d
	}
	what := describeReply(r)
	switch {
	case outcome == outcomeNoRetry:
		d.Result.Status = outboxdb.StatusFailed
		d.Result.Class = outboxdb.ClassRejected
		d.Result.Error = fmt.Sprintf("not retried (rules[%d] no_retry): %s", ruleIdx, what)
	case p.lastAttempt(attempt):
		d.Result.Status = outboxdb.StatusFailed
		d.Result.Class = outboxdb.ClassTransient
		d.Result.Error = fmt.Sprintf("giving up after %d attempts: %s", attempt, what)
	default:
		d.Result.Status = outboxdb.StatusPending
		d.Result.RetryIn = p.backoff.delay(attempt, p.rnd())
		if d.PauseFor > 0 {
			d.Result.RetryIn = d.PauseFor
		}
		d.Result.Error = what
	}
	return d
}

// notCounted is d for a reply whose attempt must not count: the gate found
// the platform down, or the request was a probe (docs/guarantees.md #13).
// Such an unavailable reply says nothing about the row: a probe, or an
// attempt that would make the row FAILED, is logged but not counted, and
// the row waits its retry delay (or the pause asked for) with its attempts
// unchanged, so that neither a failed probe nor an outage of any length
// makes a row FAILED. Other outcomes are d unchanged.
func (p policy) notCounted(d decision, r response, attempt int, probe bool) decision {
	if d.Health != unavailable || !(probe || d.Result.Status == outboxdb.StatusFailed) {
		return d
	}
	d.Result.Status = outboxdb.StatusPending
	d.Result.Class = ""
	d.Result.RetryIn = p.backoff.delay(attempt, p.rnd())
	if d.PauseFor > 0 {
		d.Result.RetryIn = d.PauseFor
	}
	d.Result.Undo, d.Result.Logged = true, true
	d.Result.Error = "platform unavailable, attempt not counted: " + describeReply(r)
	return d
}

// overloaded says whether r asks for fewer requests: no reply in time, a
// refused connection, 429, or a gateway or service that cannot take more.
func overloaded(r response) bool {
	switch r.Status {
	case 0, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// replyHealth says whether r shows the platform up.
func replyHealth(r response) health {
	switch {
	case r.Status == 0: // no reply: refused, reset, timed out
		return unavailable
	case r.Status >= 500, r.Status == 429:
		return unavailable
	case r.Status >= 200 && r.Status < 300 && r.Body == nil:
		// A 2xx that is not JSON comes from something in front of the
		// platform (a maintenance page, a proxy), not from the platform.
		return unavailable
	default:
		return healthy
	}
}

// describeReply says what came back, for last_error.
func describeReply(r response) string {
	switch {
	case r.Status == 0:
		return r.Err
	case r.Err != "":
		return fmt.Sprintf("http %d: %s", r.Status, r.Err)
	case r.Snippet == "":
		return fmt.Sprintf("http %d (empty body)", r.Status)
	default:
		return fmt.Sprintf("http %d: %s", r.Status, r.Snippet)
	}
}

// platformErrcode is the reply's errcode as text, "" when it has none.
func platformErrcode(body any) string {
	obj, ok := body.(map[string]any)
	if !ok {
		return ""
	}
	switch v := obj["errcode"].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	default:
		return ""
	}
}
