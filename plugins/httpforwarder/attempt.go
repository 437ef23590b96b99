package httpforwarder

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// attempt is one message of a batch on its way through the output.
type attempt struct {
	claim  msgmeta.Claim
	url    string
	header http.Header
	body   []byte
	// buildErr is an interpolation error of url or headers: the request is
	// not made and the rules see it as the transport error.
	buildErr string

	// done marks a message settled without a request (or interrupted);
	// skip one whose result must not be written at all (its claim was lost).
	done, skip bool
	// outcome is the rule outcome of the reply, "" when none was classified.
	outcome string
	result  outboxdb.Result

	// trace is the message's context when the stream traces (its
	// outbox.claim span), then that of its platform.request span once the
	// request is made; nil otherwise (docs/operations.md, "Tracing").
	trace context.Context
}

func (a *attempt) apiLabel() string {
	if a.claim.APIType == "" {
		return "unknown"
	}
	return a.claim.APIType
}

// prepare builds a message's request, or settles a message that must not be
// sent.
func (h *httpForwarder) prepare(a *attempt, msg *service.Message) {
	fail := func(reason string) {
		h.mMappingErrors.Incr(1, a.apiLabel())
		a.done = true
		a.result = outboxdb.Result{Status: outboxdb.StatusFailed, Class: outboxdb.ClassInvalid, Error: h.transport.redact.text(reason)}
	}
	if merr := msg.GetError(); merr != nil {
		reason := merr.Error()
		if !strings.HasPrefix(reason, "mapping: ") {
			reason = "mapping: " + reason
		}
		fail(reason)
		return
	}
	raw, err := msg.AsBytes()
	if err != nil {
		fail("mapping: reading the mapped body: " + err.Error())
		return
	}
	if a.body, err = h.transport.body(raw); err != nil {
		fail("mapping: " + err.Error())
		return
	}
	if a.url, err = h.url.TryString(msg); err != nil {
		a.buildErr = "building the url: " + err.Error()
		return
	}
	if h.staticHeader != nil {
		a.header = h.staticHeader
		return
	}
	a.header = make(http.Header, len(h.headers)+1)
	a.header.Set("Content-Type", "application/json")
	for k, v := range h.headers {
		s, err := v.TryString(msg)
		if err != nil {
			a.buildErr = fmt.Sprintf("building header %s: %v", k, err)
			return
		}
		a.header.Set(k, s)
	}
}

// leaseOf is what the dispatcher d (nil when the stream has none) and the
// message say of a's lease.
func leaseOf(d *dispatch.Dispatcher, a *attempt) claimLease {
	l := claimLease{ends: a.claim.LeaseExpiresAt}
	if d == nil {
		return l
	}
	switch state, held, renewing := d.LeaseFor(outboxdb.ClaimRef{ID: a.claim.ID, ClaimToken: a.claim.Token}); state {
	case dispatch.LeaseLost:
		l.lost = true
	case dispatch.LeaseHeld:
		l.renewing, l.ends = renewing, held
	}
	return l
}

// send makes the request of a, admitted by ticket, and turns its reply into
// a result; the ticket is finished or dropped on every path.
func (h *httpForwarder) send(ctx context.Context, d *dispatch.Dispatcher, a *attempt, ticket *protection.Ticket) {
	lease := leaseOf(d, a)
	timeout, why := h.policy.requestBudget(lease, time.Now())
	switch why {
	case lostClaim:
		ticket.Drop()
		a.done, a.skip = true, true
		h.mReturned.Incr(1, returnedLost)
		h.returns.Warn(returnedLost, "not sent: the claim was lost (another instance took the row after its lease ran out); its result is not written here")
		return
	case shortLease:
		ticket.Drop()
		h.giveBack(a, returnedLease, fmt.Sprintf("not sent: the claim lease ends in %v and cannot be renewed, too soon for a request and its result", time.Until(lease.ends).Round(time.Millisecond)))
		a.result.ForLease = true
		return
	}
	var span trace.Span
	if a.trace != nil {
		a.trace, span = h.tracer.Start(a.trace, tracectx.SpanRequest, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.Int64("outbox.id", a.claim.ID), attribute.Int("outbox.attempt", a.claim.Attempt)))
		defer func() { endRequestSpan(span, a) }()
		// The request carries the span (its traceparent header) and
		// keeps ctx's cancellation.
		ctx = trace.ContextWithSpan(ctx, span)
	}
	start := time.Now()
	var r response
	if a.buildErr != "" {
		r.Err = h.transport.redact.text(a.buildErr)
	} else {
		r = h.transport.do(ctx, a.url, a.header, a.body, timeout)
	}
	took := time.Since(start)
	if r.Stopped {
		ticket.Drop()
		// Stopping, not a platform failure. The request may have reached
		// the platform, so the attempt counts; the row is due again at once.
		a.done = true
		a.result = outboxdb.Result{Status: outboxdb.StatusPending, Sent: true, Duration: took, Error: r.Err}
		return
	}
	t := try{attempt: a.claim.Attempt, probe: ticket.Probe(), previousFailure: a.claim.PreviousFailure, took: took, now: time.Now()}
	dec := h.policy.decide(r, t, func(rep protection.Reply) bool { return ticket.Finish(ctx, rep) })
	if dec.RuleErr != nil {
		h.log.Debugf("outbox row %d: %v", a.claim.ID, dec.RuleErr)
	}
	api := a.apiLabel()
	h.mAttempts.Incr(1, api, dec.Outcome)
	h.mLatency.Timing(took.Nanoseconds(), api)
	a.outcome = dec.Outcome
	a.result = dec.Result
	a.result.Sent = a.buildErr == ""
}

// giveBack settles a claim unsent: the row is due again at once and the
// attempt does not count (otherwise a row on its last attempt would be failed
// by the next claim without ever being sent).
func (h *httpForwarder) giveBack(a *attempt, reason, why string) {
	a.done = true
	a.result = outboxdb.Result{Status: outboxdb.StatusPending, Undo: true, Error: why}
	h.mReturned.Incr(1, reason)
	h.returns.Warn(reason, why)
}

// record writes the batch's outcomes, with those of the batches that finish
// at the same time (dispatch.Recorder), then logs and counts the recorded
// ones.
func (h *httpForwarder) record(ctx context.Context, rec *dispatch.Recorder, d *dispatch.Dispatcher, atts []*attempt) error {
	results := make([]outboxdb.Result, 0, len(atts))
	// Without a dispatcher renewing them, the claims end with the leases
	// the messages carry: past the first, the write could no longer match.
	var claimsEnd time.Time
	for _, a := range atts {
		if a.skip {
			continue
		}
		r := a.result
		r.ID, r.ClaimToken = a.claim.ID, a.claim.Token
		results = append(results, r)
		if le := a.claim.LeaseExpiresAt; d == nil && le.After(time.Now()) && (claimsEnd.IsZero() || le.Before(claimsEnd)) {
			claimsEnd = le
		}
	}
	if len(results) == 0 {
		return nil
	}
	var (
		recorded []int64
		err      error
	)
	if h.tracer != nil {
		parents := make([]context.Context, 0, len(results))
		for _, a := range atts {
			if !a.skip {
				parents = append(parents, a.trace)
			}
		}
		recorded, err = rec.RecordDurablyTraced(ctx, h.tracer, parents, results, claimsEnd)
	} else {
		recorded, err = rec.RecordDurably(ctx, results, claimsEnd)
	}
	if err != nil {
		return fmt.Errorf("recording %d forward results: %w", len(results), err)
	}

	ok := make(map[int64]struct{}, len(recorded))
	for _, id := range recorded {
		ok[id] = struct{}{}
	}
	var firstRetry time.Duration = -1
	for _, a := range atts {
		if a.skip {
			continue
		}
		r := a.result
		if _, done := ok[a.claim.ID]; !done {
			h.returns.Warn("unrecorded", fmt.Sprintf("result not recorded: the claim was lost (lease expired and the row was claimed again, or it was finished), e.g. row %d attempt %d", a.claim.ID, a.claim.Attempt))
			continue
		}
		h.log.Tracef("Outbox row %d (key %s) attempt %d: %s, outcome %q, http %d, platform errcode %q, retry in %v: %s",
			a.claim.ID, a.claim.MessageKey, a.claim.Attempt, r.Status, a.outcome, r.HTTPStatus, r.PlatformErrcode, r.RetryIn, r.Error)
		switch {
		case r.Undo:
		case r.Status == outboxdb.StatusSuccess:
			if !a.claim.CreatedAt.IsZero() {
				h.mEndToEnd.Timing(time.Since(a.claim.CreatedAt).Nanoseconds(), a.apiLabel())
			}
		case r.Status == outboxdb.StatusFailed:
			h.returns.Warn("failed", fmt.Sprintf("outbox row %d (key %s) FAILED at attempt %d (platform errcode %q): %s", a.claim.ID, a.claim.MessageKey, a.claim.Attempt, r.PlatformErrcode, r.Error))
		case r.Status == outboxdb.StatusPending && (firstRetry < 0 || r.RetryIn < firstRetry):
			firstRetry = r.RetryIn
		}
	}
	// Tell the dispatcher when the earliest retry just recorded is due, so
	// that it claims it on time without polling for it.
	if d != nil && firstRetry >= 0 {
		d.DueAt(time.Now().Add(firstRetry))
	}
	return nil
}

// endRequestSpan ends the platform.request span of a with what came of the
// request: the rule outcome, the platform's errcode, the HTTP status, the
// status the row is written with and, for a failed attempt, its error.
func endRequestSpan(span trace.Span, a *attempt) {
	r := a.result
	span.SetAttributes(
		attribute.String("forwarder.outcome", a.outcome),
		attribute.String("platform.errcode", r.PlatformErrcode),
		attribute.Int("http.response.status_code", r.HTTPStatus),
		attribute.String("outbox.status", string(r.Status)),
	)
	if r.Status != outboxdb.StatusSuccess {
		span.SetStatus(codes.Error, r.Error)
	}
	span.End()
}
