// Package httpforwarder holds the http_forwarder output: it POSTs claimed
// outbox rows to the parking platform, classifies each reply with expr rules
// and records every outcome in PostgreSQL, fenced by the row's claim.
//
// The output is an adapter: transport.go makes the requests (credentials,
// timeouts, reading and redacting replies), outcome.go decides what a reply
// means for its row (pure), and the stream's dispatch engine
// (internal/dispatch) knows the leases and takes the results.
package httpforwarder

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/envsecret"
	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
	"github.com/forwarder/forwarder/internal/streamdb"
)

const (
	hfFieldURL              = "url"
	hfFieldHeaders          = "headers"
	hfFieldTimeout          = "timeout"
	hfFieldMaxInFlight      = "max_in_flight"
	hfFieldTLS              = "tls"
	hfFieldAccessName       = "access_name"
	hfFieldAccessPwd        = "access_pwd"
	hfFieldRules            = "rules"
	hfFieldRuleWhen         = "when"
	hfFieldRuleOutcome      = "outcome"
	hfFieldRuleMessage      = "message_specific"
	hfFieldRetry            = "retry"
	hfFieldRetryInitial     = "initial"
	hfFieldRetryMax         = "max"
	hfFieldRetryMultiplier  = "multiplier"
	hfFieldRetryJitter      = "jitter"
	hfFieldRetryMaxAttempts = "max_attempts"
	hfFieldLease            = "lease"
	hfFieldBatching         = "batching"
	hfFieldProbeInterval    = "probe_interval"
	hfFieldRateLimit        = "rate_limit"
	hfFieldBreaker          = "breaker"
	hfFieldBreakerWindow    = "window"
	hfFieldBreakerMessages  = "messages"
	hfFieldBreakerSilence   = "silence"
	hfFieldBreakerHalfOpen  = "half_open_messages"
)

const (
	// recordTimeout bounds the retries of the result write, which stop
	// earlier when a claim of the batch ends first (past it the write could
	// no longer match). It runs even when the batch's context is cancelled:
	// the requests were made and must be recorded, or they are sent again.
	recordTimeout = 15 * time.Second
	// resultMargin is the lease kept, beyond a request, for writing its
	// result when leases are not being renewed: a request is cut to the
	// lease left minus this, so that a slow reply recorded late does not
	// lose its claim to another instance that would send the message again.
	resultMargin = time.Second
	// minRequest is the shortest request worth making: with less lease left
	// than this plus resultMargin, the claim is given back unsent.
	minRequest = 100 * time.Millisecond
	// recordRetryMax caps the pause between two tries of the result write.
	recordRetryMax = 2 * time.Second
	// maxResultsPerStatement caps one result write gathering the outcomes
	// of concurrent batches.
	maxResultsPerStatement = 1000

	defaultTimeout = "10s"
)

// Reasons a claim goes back unsent, as counted.
const (
	returnedLease    = "lease"
	returnedStopping = "stopping"
	returnedLost     = "lost"
	returnedBreaker  = "breaker"
)

func httpForwarderSpec() *service.ConfigSpec {
	defaultRulesConf := make([]any, len(defaultRules))
	for i, r := range defaultRules {
		defaultRulesConf[i] = map[string]any{hfFieldRuleWhen: r.When, hfFieldRuleOutcome: r.Outcome}
	}
	return service.NewConfigSpec().
		Beta().
		Categories("Network").
		Summary("POSTs claimed outbox rows to the parking platform, classifies each reply with expr rules and records the outcome of every attempt in PostgreSQL.").
		Description(`
Meant to be fed by the `+"`outbox_retry`"+` input through a mapping that turns the stored payload into the platform's JSON request. Each message must carry the input's metadata: `+"`outbox_id`, `claim_token`, `attempt`"+` (required), `+"`api_type`, `message_key`, `outbox_created_at_ms`, `lease_expires_at_ms`"+` (optional).

For each message the output adds the credentials `+"`access_name`"+` and `+"`access_pwd`"+` as the first keys of the JSON object (they are never stored, logged or put in metrics), POSTs it to `+"`url`"+` and evaluates `+"`rules`"+` in order against the reply; the first rule whose `+"`when`"+` is true gives the outcome, and a reply no rule matches is retried:

- `+"`success`"+`, `+"`duplicate`"+`: the row becomes SUCCESS.
- `+"`no_retry`"+`: the row becomes FAILED.
- `+"`retry`"+`: the row goes back to PENDING, due after the backoff of `+"`retry`"+`, or becomes FAILED once `+"`attempt`"+` has reached `+"`retry.max_attempts`"+`. A `+"`Retry-After`"+` header on a 429 or 503 reply replaces the computed delay (capped at `+"`retry.max`"+`).

A message flagged with an error (a failed mapping) is never sent: its row becomes FAILED with `+"`last_error`"+` set to `+"`mapping: <error>`"+`, and so does a message whose mapped body is not a JSON object.

The claim of each message must hold until its result is written. The stream's `+"`outbox_retry`"+` input renews the leases of the rows it holds, so a request may take its whole `+"`timeout`"+`; a row whose claim that input found lost (another instance took it) is not sent. When leases cannot be renewed (the database is unreachable) a request is cut to the lease left, and a message with too little lease left is given back unsent: the row goes back to PENDING, due at once, without spending an attempt — at most three times in a row, after which the give-back counts as an attempt, so that no row is returned forever. So is a message still waiting for a request slot when the output stops (that give-back never counts). Give-backs are counted in `+"`forwarder_claims_returned_total{reason}`"+` and logged once per burst.

All outcomes of a batch are written in one statement: each row's status, `+"`next_retry_at`"+`, `+"`last_http_status`"+`, `+"`last_error`"+` in its delivery state (a delivered row's state is removed: its `+"`SUCCESS`"+` attempt says when and by whom), plus one `+"`forward_retry_logs`"+` row per attempt. The write is fenced by the claim token: a row that was claimed again by someone else after its lease ran out is left alone. A retryable platform failure is a recorded PENDING row, not an error: the batch is acknowledged once its outcomes are recorded, and fails only when the database write does.

All writes of this output share at most `+"`max_in_flight`"+` requests in flight, and one keep-alive HTTP/1.1 connection pool of that size.

== Protecting the platform

Each reply is judged on its own, whatever the rules make of it: a reply the platform produced on purpose (any JSON answer, any `+"`errcode`"+`, any 4xx but 429, a reply a rule settles as `+"`success`, `duplicate` or `no_retry`"+`, or marks `+"`message_specific`"+`) shows it *healthy*; no reply, a timeout, a 5xx, a 429 or a 2xx that is not JSON shows it *unavailable*. The platform is judged, not a message: replies about one message count once, and a message that fails while others are answered is failing on its own.

- *Circuit breaker, shared by every instance on the database.* When failures span `+"`breaker.messages`"+` distinct messages and the platform has answered nothing for `+"`breaker.silence`"+`, the breaker opens, in PostgreSQL, and every instance stops sending within a second: rows stay PENDING and keep their attempts (claims held when it opened are given back unsent), new rows are not claimed. Only probes go: at most one per `+"`probe_interval`"+` across all instances, each carrying a message not failing on its own (never attempted first, never the same row twice in a row). A healthy probe half-opens it: sending resumes with concurrency ramping up from one; `+"`breaker.half_open_messages`"+` distinct messages answered close it, and one message's failures never reopen it. A failed probe never spends its row's attempt. A failed attempt counts only while the platform is evidently up (it answered another message within `+"`breaker.window`"+`, and since this message last failed): an outage of any length leaves no row FAILED, while a message the platform always fails ends FAILED after its attempts and never slows the others.
- *Retry-After.* A 429 or 503 with `+"`Retry-After`"+` pauses sending on every instance for that long (capped at `+"`retry.max`"+`).
- *Adaptive concurrency.* Requests in flight adapt between 1 and `+"`max_in_flight`"+`: one more per round trip of healthy replies, half as many after replies that ask for less (no reply in time, a refused connection, 429, 502, 503, 504; not a 500).
- *Rate limit.* `+"`rate_limit`"+` caps requests per second across every instance on the database (a token bucket in PostgreSQL, taken a tenth of a second's worth at a time); `+"`0`"+`: no limit.

== Metrics

- `+"`forwarder_attempts_total{api_type,outcome}`"+`: requests made, by the rule outcome.
- `+"`forwarder_forward_latency_seconds{api_type}`"+`: request duration, connect to last byte.
- `+"`forwarder_end_to_end_latency_seconds{api_type}`"+`: from row creation to its recorded SUCCESS.
- `+"`forwarder_mapping_errors_total{api_type}`"+`: messages not sent because their mapping failed.
- `+"`forwarder_semaphore_available_permits`"+`: free request slots.
- `+"`forwarder_claims_returned_total{reason}`"+`: claims given back unsent (`+"`lease`"+`, `+"`stopping`"+`, `+"`breaker`"+`: the breaker was open or sending paused) or not sent because they were lost (`+"`lost`"+`).
- `+"`forwarder_platform_breaker_state`"+` (0 closed, 1 half-open, 2 open), `+"`forwarder_platform_concurrency_limit`"+`, `+"`forwarder_platform_probes_total{result}`"+` (`+"`healthy`, `unavailable`, `inconclusive`"+`: a failed probe whose message had already failed on its own).

== Rule expressions

Rules are https://expr-lang.org[expr^] expressions, compiled at start-up (and by `+"`forwarder lint`"+`), over:

- `+"`status`"+` (int): the HTTP status, 0 when no reply came.
- `+"`headers`"+` (map of string): reply headers by canonical name (`+"`Retry-After`"+`), first value.
- `+"`body`"+`: the reply parsed as JSON (numbers are floats), nil when it is not JSON or longer than 64 KiB. Use `+"`body?.field`"+` so a nil body does not match instead of failing.
- `+"`error`"+` (string): the transport error (timeout, refused connection), empty when a reply came.

Setting `+"`rules`"+` replaces the defaults, which implement the platform's contract: errcode "4" (string or number) is a duplicate, errcode "998" must not be resent, result 0 is a success, everything else is retried.`).
		Fields(streamdb.DSNFields()...).
		Fields(
			service.NewInterpolatedStringField(hfFieldURL).
				Description("The URL to POST each message to, interpolated per message.").
				Example(`${PLATFORM_URL}${! if meta("api_type") == "HEARTBEAT" { "/mch/heartbeat" } else { "/mch/business" } }`),
			service.NewInterpolatedStringMapField(hfFieldHeaders).
				Description("Request headers, interpolated per message. `Content-Type: application/json` is sent unless set here.").
				Example(map[string]any{"X-Request-Id": `${! meta("message_key") }`}).
				Default(map[string]any{}).
				Advanced(),
			service.NewDurationField(hfFieldTimeout).
				Description("Limit on one request, from connecting to the last byte of the reply (`FORWARD_TIMEOUT`). Must be less than the `lease` of the stream's `outbox_retry` input (`CLAIM_LEASE`).").
				Default(defaultTimeout),
			service.NewIntField(hfFieldMaxInFlight).
				Description("Requests in flight at once, over all batches of this output (`FORWARD_MAX_IN_FLIGHT`). Also the number of concurrent batches and of idle keep-alive connections kept.").
				Default(100),
			service.NewTLSToggledField(hfFieldTLS),
		).
		Fields(envsecret.Fields(hfFieldAccessName, "The platform's `access_name`, added to every request body. Required at start-up; `forwarder lint` passes without it.", "PLATFORM_ACCESS_NAME")...).
		Fields(envsecret.Fields(hfFieldAccessPwd, "The platform's `access_pwd`, added to every request body. Required at start-up; `forwarder lint` passes without it.", "PLATFORM_ACCESS_PWD")...).
		Fields(
			service.NewObjectListField(hfFieldRules,
				service.NewStringField(hfFieldRuleWhen).
					Description("An expr expression over `status`, `headers`, `body` and `error` that must give a boolean.").
					Example(`status == 200 && body?.code == "OK"`),
				service.NewStringEnumField(hfFieldRuleOutcome, outcomes...).
					Description("What a reply matching `when` means: `success` or `duplicate` (SUCCESS), `no_retry` (FAILED), `retry` (PENDING, FAILED at `retry.max_attempts`)."),
				service.NewBoolField(hfFieldRuleMessage).
					Description("The reply concerns its message, not the platform's health, whatever its status (say a 500 with a JSON error the platform's parser gives for a bad field): it never counts toward opening the breaker and never halves the concurrency limit, and its attempt always counts.").
					Default(false),
			).
				Description("Ordered reply rules: the first whose `when` is true decides; a reply no rule matches is retried. Setting this list replaces the defaults.").
				Default(defaultRulesConf).
				LintRule(rulesLintRule),
			service.NewObjectField(hfFieldRetry,
				service.NewDurationField(hfFieldRetryInitial).
					Description("Delay after the first failed attempt (`FORWARD_RETRY_INITIAL`).").
					Default("5s"),
				service.NewDurationField(hfFieldRetryMax).
					Description("Cap on any retry delay, `Retry-After` included (`FORWARD_RETRY_MAX`).").
					Default("300s"),
				service.NewFloatField(hfFieldRetryMultiplier).
					Description("Growth of the delay per attempt: delay = min(initial × multiplier^(attempt−1), max).").
					Default(2.0),
				service.NewFloatField(hfFieldRetryJitter).
					Description("Random spread of each delay, as a fraction of it: 0.1 is ±10 %.").
					Default(0.1),
				service.NewIntField(hfFieldRetryMaxAttempts).
					Description("Attempts before a retryable row becomes FAILED (`FORWARD_MAX_ATTEMPTS`).").
					Default(5),
			).Description("The retry schedule of rows whose reply is retryable."),
			service.NewStringField(hfFieldLease).
				Description("The claim lease of the feeding `outbox_retry` input, for an output whose input is in another stream. When set, start-up fails unless `timeout` is less than it. An `outbox_retry` input in the same stream is checked against without it.").
				Example("60s").
				Default("").
				Advanced(),
			service.NewDurationField(hfFieldProbeInterval).
				Description("While the breaker is open, at most one probe request per interval across every instance on the database (`PLATFORM_PROBE_INTERVAL`).").
				Default("5s").
				Example("${PLATFORM_PROBE_INTERVAL:5s}"),
			service.NewFloatField(hfFieldRateLimit).
				Description("Requests per second to the platform across every instance on the database (`FORWARD_RATE_LIMIT`); `0`: no limit.").
				Default(0).
				Example("${FORWARD_RATE_LIMIT:0}"),
			service.NewObjectField(hfFieldBreaker,
				service.NewDurationField(hfFieldBreakerWindow).Description("How far back replies count.").Default("10s"),
				service.NewIntField(hfFieldBreakerMessages).Description("Distinct messages that must have found the platform unavailable since its last healthy reply before it is judged down; replies about one message count once.").Default(5),
				service.NewDurationField(hfFieldBreakerSilence).Description("How long the platform must have answered no message before the breaker opens.").Default("3s"),
				service.NewIntField(hfFieldBreakerHalfOpen).Description("Distinct messages answered healthy that close a half-open breaker.").Default(10),
			).
				Description("When the platform is judged down (see Protecting the platform).").
				Advanced(),
			service.NewBatchPolicyField(hfFieldBatching),
		).
		LintRule(leaseLintRule).
		Example("Forward to the platform", "The output of `pipelines/forwarder.yaml`: every tunable from the environment; the database and the credentials are read from `DATABASE_URL`, `PLATFORM_ACCESS_NAME` and `PLATFORM_ACCESS_PWD` directly.", exampleForwardYAML).
		Example("Custom rules", "A platform that answers `{\"code\": \"OK\"}`, reports duplicates with a 409 and rejects with a 400 or 422.", exampleRulesYAML)
}

const exampleForwardYAML = `
output:
  http_forwarder:
    url: '${PLATFORM_URL:http://localhost:8080}${! if meta("api_type") == "HEARTBEAT" { "/mch/heartbeat" } else { "/mch/business" } }'
    timeout: ${FORWARD_TIMEOUT:10s}
    max_in_flight: ${FORWARD_MAX_IN_FLIGHT:100}
    retry:
      initial: ${FORWARD_RETRY_INITIAL:5s}
      max: ${FORWARD_RETRY_MAX:300s}
      max_attempts: ${FORWARD_MAX_ATTEMPTS:5}
`

const exampleRulesYAML = `
output:
  http_forwarder:
    url: ${PLATFORM_URL:http://localhost:8080}/events
    rules:
      - when: 'status == 200 && body?.code == "OK"'
        outcome: success
      - when: 'status == 409'
        outcome: duplicate
      - when: 'status in [400, 422]'
        outcome: no_retry
`

func init() {
	// The spec's lint rules call these methods: they must exist before the
	// spec is built.
	if err := registerLintMethods(); err != nil {
		panic(err)
	}
	service.MustRegisterBatchOutput("http_forwarder", httpForwarderSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			out, err := newHTTPForwarderFromParsed(conf, mgr)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			policy, err := conf.FieldBatchPolicy(hfFieldBatching)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			// As many concurrent batches as request slots: single-message
			// batches still fill every slot. The gate's concurrency limit,
			// not the engine, bounds the requests.
			return out, policy, out.gate.Limiter().Max(), nil
		})
}

// httpForwarder is the http_forwarder output.
type httpForwarder struct {
	log *service.Logger
	hub *dispatch.Hub

	url     *service.InterpolatedString
	headers map[string]*service.InterpolatedString
	// staticHeader is shared by every request when no header is
	// interpolated (the client never changes a request's headers).
	staticHeader http.Header
	timeout      time.Duration
	// lease, when set, is the claim lease of an input in another stream.
	lease time.Duration

	policy    policy
	transport *transport
	gate      *protection.Gate
	returns   *lograte.Burst

	connMu   sync.Mutex
	pool     atomic.Pointer[pgxpool.Pool]
	recorder atomic.Pointer[dispatch.Recorder]

	mAttempts      *service.MetricCounter
	mLatency       *service.MetricTimer
	mEndToEnd      *service.MetricTimer
	mMappingErrors *service.MetricCounter
	mReturned      *service.MetricCounter
}

func newHTTPForwarderFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*httpForwarder, error) {
	h := &httpForwarder{log: mgr.Logger()}
	var err error
	if h.url, err = conf.FieldInterpolatedString(hfFieldURL); err != nil {
		return nil, err
	}
	if h.headers, err = conf.FieldInterpolatedStringMap(hfFieldHeaders); err != nil {
		return nil, err
	}
	h.staticHeader = http.Header{"Content-Type": {"application/json"}}
	for k, v := range h.headers {
		s, ok := v.Static()
		if !ok {
			h.staticHeader = nil
			break
		}
		h.staticHeader.Set(k, s)
	}
	if h.timeout, err = conf.FieldDuration(hfFieldTimeout); err != nil {
		return nil, err
	}
	if h.timeout <= 0 {
		return nil, fmt.Errorf("field %s: must be positive, got %v", hfFieldTimeout, h.timeout)
	}
	if h.lease, err = parseLease(conf); err != nil {
		return nil, err
	}
	if h.lease > 0 {
		if err := leaseError(h.timeout, h.lease); err != nil {
			return nil, err
		}
	}
	maxInFlight, err := conf.FieldInt(hfFieldMaxInFlight)
	if err != nil {
		return nil, err
	}
	if maxInFlight < 1 {
		return nil, fmt.Errorf("field %s: must be at least 1, got %d", hfFieldMaxInFlight, maxInFlight)
	}
	name, err := secretField(conf, hfFieldAccessName)
	if err != nil {
		return nil, err
	}
	pwd, err := secretField(conf, hfFieldAccessPwd)
	if err != nil {
		return nil, err
	}
	if h.policy.rules, err = parseRules(conf); err != nil {
		return nil, err
	}
	if h.policy.backoff, h.policy.maxAttempts, err = parseRetry(conf); err != nil {
		return nil, err
	}
	h.policy.rnd = rand.Float64
	tlsConf, tlsEnabled, err := conf.FieldTLSToggled(hfFieldTLS)
	if err != nil {
		return nil, err
	}
	if !tlsEnabled {
		tlsConf = nil
	}
	h.transport = newTransport(h.timeout, maxInFlight, tlsConf, name, pwd)
	// The URL as a message without metadata would have it: enough to see
	// the scheme and host, which per-message interpolation rarely changes.
	if u, err := h.url.TryString(service.NewMessage(nil)); err == nil {
		if host := cleartextHost(u); host != "" {
			h.log.Warnf("the platform URL is plain http:// to %s: access_name and access_pwd go over the network unencrypted in every request; use https://", host)
		}
	}
	h.transport.copyHeaders = h.policy.rules.usesHeaders

	if h.hub, err = dispatch.HubFromParsed(conf, mgr); err != nil {
		return nil, err
	}

	m := mgr.Metrics()
	h.mAttempts = m.NewCounter("forwarder_attempts_total", "api_type", "outcome")
	h.mLatency = m.NewTimer("forwarder_forward_latency_seconds", "api_type")
	h.mEndToEnd = m.NewTimer("forwarder_end_to_end_latency_seconds", "api_type")
	h.mMappingErrors = m.NewCounter("forwarder_mapping_errors_total", "api_type")
	h.mReturned = m.NewCounter("forwarder_claims_returned_total", "reason")
	// Every series at 0 from the start (internal/metricseries).
	apiTypes := metricseries.Product([]string{outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat})
	metricseries.Counter(h.mAttempts, metricseries.Product([]string{outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat}, outcomes)...)
	metricseries.Timer(h.mLatency, apiTypes...)
	metricseries.Timer(h.mEndToEnd, apiTypes...)
	metricseries.Counter(h.mMappingErrors, apiTypes...)
	metricseries.Counter(h.mReturned, metricseries.Product([]string{returnedLease, returnedStopping, returnedLost, returnedBreaker})...)
	gateCfg, err := parseGate(conf, maxInFlight)
	if err != nil {
		return nil, err
	}
	probes := m.NewCounter("forwarder_platform_probes_total", "result")
	h.gate = protection.NewGate(gateCfg, h.log, protection.Metrics{
		State:  m.NewGauge("forwarder_platform_breaker_state"),
		Limit:  m.NewGauge("forwarder_platform_concurrency_limit"),
		Free:   m.NewGauge("forwarder_semaphore_available_permits"),
		Probes: probes,
	})
	metricseries.Counter(probes, metricseries.Product([]string{"healthy", "unavailable", "inconclusive"})...)
	// The stream's claim engine checks its lease against the timeout, uses
	// these attempts and claims only what the gate lets through.
	if err := h.hub.AttachOutput(dispatch.Output{Timeout: h.timeout, MaxAttempts: h.policy.maxAttempts, Protection: h.gate}); err != nil {
		return nil, err
	}
	h.returns = lograte.New(h.log, 10*time.Second)
	return h, nil
}

// secretField reads a required credential (internal/envsecret). Its
// absence is an error naming the variable; its value never appears anywhere.
func secretField(conf *service.ParsedConfig, field string) (string, error) {
	v, source, err := envsecret.Read(conf, field)
	if err != nil || v != "" {
		return v, err
	}
	return "", fmt.Errorf("%s is not set: set the environment variable %s (or the field %s)", field, source, field)
}

func parseLease(conf *service.ParsedConfig) (time.Duration, error) {
	s, err := conf.FieldString(hfFieldLease)
	if err != nil || s == "" {
		return 0, err
	}
	lease, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("field %s: %q is not a duration: %w", hfFieldLease, s, err)
	}
	return lease, nil
}

func leaseError(timeout, lease time.Duration) error {
	if timeout >= lease {
		return fmt.Errorf("timeout (%v) must be less than lease (%v): CLAIM_LEASE must exceed FORWARD_TIMEOUT, or a request could outlive its claim", timeout, lease)
	}
	return nil
}

func parseGate(conf *service.ParsedConfig, maxInFlight int) (protection.Config, error) {
	c := protection.Config{MaxInFlight: maxInFlight}
	var err error
	if c.ProbeInterval, err = conf.FieldDuration(hfFieldProbeInterval); err != nil {
		return c, err
	}
	if c.ProbeInterval <= 0 {
		return c, fmt.Errorf("field %s: must be positive, got %v (PLATFORM_PROBE_INTERVAL)", hfFieldProbeInterval, c.ProbeInterval)
	}
	if c.RateLimit, err = conf.FieldFloat(hfFieldRateLimit); err != nil {
		return c, err
	}
	if c.RateLimit < 0 {
		return c, fmt.Errorf("field %s: must not be negative, got %v (FORWARD_RATE_LIMIT)", hfFieldRateLimit, c.RateLimit)
	}
	b := conf.Namespace(hfFieldBreaker)
	if c.Breaker.Window, err = b.FieldDuration(hfFieldBreakerWindow); err != nil {
		return c, err
	}
	if c.Breaker.Messages, err = b.FieldInt(hfFieldBreakerMessages); err != nil {
		return c, err
	}
	if c.Breaker.Silence, err = b.FieldDuration(hfFieldBreakerSilence); err != nil {
		return c, err
	}
	if c.Breaker.HalfOpenMessages, err = b.FieldInt(hfFieldBreakerHalfOpen); err != nil {
		return c, err
	}
	switch {
	case c.Breaker.Window <= 0:
		return c, fmt.Errorf("field breaker.window: must be positive, got %v", c.Breaker.Window)
	case c.Breaker.Silence <= 0:
		return c, fmt.Errorf("field breaker.silence: must be positive, got %v", c.Breaker.Silence)
	case c.Breaker.Messages < 1, c.Breaker.HalfOpenMessages < 1:
		return c, errors.New("fields breaker.messages and breaker.half_open_messages must be at least 1")
	}
	host, _ := os.Hostname()
	c.Instance = host + "-" + strconv.Itoa(os.Getpid())
	return c, nil
}

func parseRules(conf *service.ParsedConfig) (ruleSet, error) {
	objs, err := conf.FieldObjectList(hfFieldRules)
	if err != nil {
		return ruleSet{}, err
	}
	specs := make([]ruleSpec, len(objs))
	for i, o := range objs {
		if specs[i].When, err = o.FieldString(hfFieldRuleWhen); err != nil {
			return ruleSet{}, fmt.Errorf("rules[%d]: %w", i, err)
		}
		if specs[i].Outcome, err = o.FieldString(hfFieldRuleOutcome); err != nil {
			return ruleSet{}, fmt.Errorf("rules[%d]: %w", i, err)
		}
		if o.Contains(hfFieldRuleMessage) {
			if specs[i].MessageSpecific, err = o.FieldBool(hfFieldRuleMessage); err != nil {
				return ruleSet{}, fmt.Errorf("rules[%d]: %w", i, err)
			}
		}
	}
	return compileRules(specs)
}

func parseRetry(conf *service.ParsedConfig) (b backoff, maxAttempts int, err error) {
	r := conf.Namespace(hfFieldRetry)
	if b.initial, err = r.FieldDuration(hfFieldRetryInitial); err != nil {
		return
	}
	if b.max, err = r.FieldDuration(hfFieldRetryMax); err != nil {
		return
	}
	if b.multiplier, err = r.FieldFloat(hfFieldRetryMultiplier); err != nil {
		return
	}
	if b.jitter, err = r.FieldFloat(hfFieldRetryJitter); err != nil {
		return
	}
	if maxAttempts, err = r.FieldInt(hfFieldRetryMaxAttempts); err != nil {
		return
	}
	switch {
	case b.initial < 0:
		err = fmt.Errorf("field retry.initial: must not be negative, got %v", b.initial)
	case b.max < b.initial:
		err = fmt.Errorf("field retry.max (%v) must not be less than retry.initial (%v)", b.max, b.initial)
	case b.multiplier < 1:
		err = fmt.Errorf("field retry.multiplier: must be at least 1, got %v", b.multiplier)
	case b.jitter < 0 || b.jitter >= 1:
		err = fmt.Errorf("field retry.jitter: must be in [0, 1), got %v", b.jitter)
	case maxAttempts < 1:
		err = fmt.Errorf("field retry.max_attempts: must be at least 1, got %d", maxAttempts)
	}
	return
}

// Connect takes the stream's pool for this database (creating or upgrading
// the schema); it is safe to call again.
func (h *httpForwarder) Connect(ctx context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if h.pool.Load() != nil {
		return nil
	}
	pool, err := h.hub.Open(ctx)
	if err != nil {
		return err
	}
	h.recorder.Store(dispatch.NewRecorder(func(ctx context.Context, results []outboxdb.Result) ([]int64, error) {
		// With the stream's ordering policy (the dispatcher's
		// order_on_failed), handing the rows it releases to the dispatcher.
		return dispatch.RecordResults(ctx, pool, h.hub.Dispatcher(), results)
	}, maxResultsPerStatement))
	if err := h.gate.Start(ctx, pool); err != nil {
		h.hub.Release()
		return err
	}
	h.pool.Store(pool)
	return nil
}

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
	// permit is what the gate allowed the request.
	permit protection.Permit
	// outcome is the rule outcome of the reply, "" when none was classified.
	outcome string
	result  outboxdb.Result
}

func (a *attempt) apiLabel() string {
	if a.claim.APIType == "" {
		return "unknown"
	}
	return a.claim.APIType
}

func (a *attempt) ref() outboxdb.ClaimRef {
	return outboxdb.ClaimRef{ID: a.claim.ID, ClaimToken: a.claim.Token}
}

// WriteBatch sends the batch's messages concurrently within the shared
// request slots, then records every outcome in one statement. It returns nil
// once the outcomes are recorded, whatever they are; an error when the
// database write fails; and a batch error for messages that carry no claim
// metadata (they cannot be recorded, so they are nacked).
func (h *httpForwarder) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	rec := h.recorder.Load()
	if rec == nil {
		return service.ErrNotConnected
	}
	var batchErr *service.BatchError
	atts := make([]*attempt, 0, len(batch))
	seen := make(map[int64]struct{}, len(batch))
	for i, msg := range batch {
		c, err := msgmeta.ReadClaim(msg)
		if err == nil {
			if _, dup := seen[c.ID]; dup {
				err = fmt.Errorf("outbox row %d appears twice in one batch", c.ID)
			}
			seen[c.ID] = struct{}{}
		}
		if err != nil {
			if batchErr == nil {
				batchErr = service.NewBatchError(batch, errors.New("http_forwarder: messages without a valid outbox claim cannot be forwarded"))
			}
			batchErr.Failed(i, err)
			continue
		}
		a := &attempt{claim: c}
		h.prepare(a, msg)
		atts = append(atts, a)
	}

	d := h.hub.Dispatcher()
	var wg sync.WaitGroup
	for _, a := range atts {
		if a.done {
			continue
		}
		if err := h.gate.Acquire(ctx); err != nil {
			h.gate.ForgetProbe(a.claim.ID)
			h.giveBack(a, returnedStopping, "not sent: the output is stopping")
			continue
		}
		// Asked once the slot is taken: the breaker may have opened while
		// this request waited for one.
		if a.permit = h.gate.Allow(a.claim.ID); a.permit == protection.Deny {
			h.gate.Release()
			h.giveBack(a, returnedBreaker, "not sent: the platform is down (circuit breaker open) or asked to pause")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.gate.Release()
			h.send(ctx, d, a)
		}()
	}
	wg.Wait()

	if err := h.record(ctx, rec, d, atts); err != nil {
		return err
	}
	if batchErr != nil {
		return batchErr
	}
	return nil
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

// requestTimeout is how long the request of a may take, or 0 when it must
// not be sent: its claim was lost (skip), or too little of its lease is
// left (give back). While the dispatcher renews leases the request may take
// the whole timeout; otherwise it is cut to the lease left minus the time
// kept for writing the result.
func (h *httpForwarder) requestTimeout(d *dispatch.Dispatcher, a *attempt) time.Duration {
	deadline := a.claim.LeaseExpiresAt
	if d != nil {
		state, held, renewing := d.LeaseFor(a.ref())
		switch state {
		case dispatch.LeaseLost:
			a.done, a.skip = true, true
			h.mReturned.Incr(1, returnedLost)
			h.returns.Warn(returnedLost, "not sent: the claim was lost (another instance took the row after its lease ran out); its result is not written here")
			return 0
		case dispatch.LeaseHeld:
			if renewing {
				return h.timeout
			}
			deadline = held
		}
	} else if h.lease > 0 && deadline.IsZero() {
		return h.timeout
	}
	if deadline.IsZero() {
		return h.timeout
	}
	left := time.Until(deadline) - resultMargin
	if left < minRequest {
		h.giveBack(a, returnedLease, fmt.Sprintf("not sent: the claim lease ends in %v and cannot be renewed, too soon for a request and its result", time.Until(deadline).Round(time.Millisecond)))
		a.result.ForLease = true
		return 0
	}
	return min(h.timeout, left)
}

// send makes one request, holding a slot, and turns its reply into a result.
func (h *httpForwarder) send(ctx context.Context, d *dispatch.Dispatcher, a *attempt) {
	timeout := h.requestTimeout(d, a)
	if timeout == 0 {
		return
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
		if a.permit == protection.Probe {
			h.gate.ForgetProbe(a.claim.ID)
		}
		// Stopping, not a platform failure. The request may have reached
		// the platform, so the attempt counts; the row is due again at once.
		a.done = true
		a.result = outboxdb.Result{Status: outboxdb.StatusPending, Sent: true, Duration: took, Error: r.Err}
		return
	}
	dec := h.policy.decide(r, a.claim.Attempt, took, time.Now())
	if dec.RuleErr != nil {
		h.log.Debugf("outbox row %d: %v", a.claim.ID, dec.RuleErr)
	}
	counted := h.gate.Report(ctx, a.claim.ID, a.permit, protection.Reply{
		Unavailable: dec.Health == unavailable,
		Fresh:       a.claim.Attempt <= 1,
		Overloaded:  dec.Overloaded,
		PauseFor:    dec.PauseFor,
		Why:         dec.Result.Error,
	})
	if !counted {
		dec = h.policy.notCounted(dec, r, a.claim.Attempt, a.permit == protection.Probe)
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
	for _, a := range atts {
		if a.skip {
			continue
		}
		r := a.result
		r.ID, r.ClaimToken = a.claim.ID, a.claim.Token
		results = append(results, r)
	}
	if len(results) == 0 {
		return nil
	}
	// Requests were made: their outcomes are written even when the batch's
	// context is cancelled. The write is fenced and idempotent, so retrying
	// it after a connection error is safe. Keep trying while the claims
	// hold: a result given up on while the database is briefly away means
	// the platform gets the message again.
	deadline := time.Now().Add(recordTimeout)
	for _, a := range atts {
		if le := a.claim.LeaseExpiresAt; !le.IsZero() && le.After(time.Now()) && le.Before(deadline) && d == nil {
			deadline = le
		}
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	var (
		recorded []int64
		err      error
	)
	for try := 1; ; try++ {
		if recorded, err = rec.Record(rctx, results); err == nil {
			break
		}
		if try == 1 {
			h.log.Warnf("Recording %d forward results failed, retrying until their claims expire: %v", len(results), err)
		}
		select {
		case <-time.After(min(time.Duration(try)*200*time.Millisecond, recordRetryMax)):
		case <-rctx.Done():
		}
		if rctx.Err() != nil {
			break
		}
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

// Close releases the pool and idle connections.
func (h *httpForwarder) Close(context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if rec := h.recorder.Swap(nil); rec != nil {
		rec.Close()
	}
	if h.pool.Swap(nil) != nil {
		h.gate.Stop()
		h.hub.Release()
	}
	h.transport.close()
	h.returns.Flush()
	return nil
}
