// Package httpforwarder holds the http_forwarder output: it POSTs claimed outbox
// rows to the parking platform, classifies each reply with expr rules and
// records every outcome in PostgreSQL, fenced by the row's claim.
package httpforwarder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/handoff"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

const (
	hfFieldDSN              = "dsn"
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
	hfFieldRetry            = "retry"
	hfFieldRetryInitial     = "initial"
	hfFieldRetryMax         = "max"
	hfFieldRetryMultiplier  = "multiplier"
	hfFieldRetryJitter      = "jitter"
	hfFieldRetryMaxAttempts = "max_attempts"
	hfFieldLease            = "lease"
	hfFieldBatching         = "batching"
)

// Metadata read from each message, as set by the outbox_retry input.
const (
	metaOutboxID         = "outbox_id"
	metaClaimToken       = "claim_token"
	metaAttempt          = "attempt"
	metaAPIType          = "api_type"
	metaMessageKey       = "message_key"
	metaCreatedAtMs      = "outbox_created_at_ms"
	metaLeaseExpiresAtMs = "lease_expires_at_ms"
)

const (
	// maxResponseBytes of a reply are read and classified; a longer reply is
	// not parsed (body is nil).
	maxResponseBytes = 64 << 10
	// maxDrainBytes more are read and discarded so the connection can be
	// reused; past that it is closed.
	maxDrainBytes = 256 << 10
	// maxSnippetBytes of a reply are quoted in last_error.
	maxSnippetBytes = 512
	// recordTimeout bounds the retries of the result write, which stop
	// earlier when a claim of the batch ends first (past it the write could
	// no longer match). It runs even when the batch's context is cancelled:
	// the requests were made and must be recorded, or they are sent again.
	recordTimeout = 15 * time.Second
	// resultMargin is the lease kept, beyond the request timeout, for writing
	// the result: a request is not started unless timeout + resultMargin of
	// the claim remain, so a slow reply recorded late cannot lose its claim
	// to another instance that would send the message again.
	resultMargin = time.Second
	// recordRetryMax caps the pause between two tries of the result write.
	recordRetryMax = 2 * time.Second

	defaultTimeout = "10s"
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

A message whose claim lease (`+"`lease_expires_at_ms`"+`) would end before its request could time out is not sent either: its claim is undone (the row goes back to PENDING, due at once, and the attempt is not counted), so that no request outlives its claim. So is a message still waiting for a request slot when the output stops.

All outcomes of a batch are written in one statement: each row's status, `+"`next_retry_at`"+`, `+"`last_http_status`"+`, `+"`last_error`"+` (and `+"`succeeded_at`"+`), plus one `+"`forward_retry_logs`"+` row per attempt. The write is fenced by the claim token: a row that was claimed again by someone else after its lease ran out is left alone. A retryable platform failure is a recorded PENDING row, not an error: the batch is acknowledged once its outcomes are recorded, and fails only when the database write does.

All writes of this output share one pool of `+"`max_in_flight`"+` request slots, and one keep-alive HTTP/1.1 connection pool of the same size.

== Metrics

- `+"`forwarder_attempts_total{api_type,outcome}`"+`: requests made, by the rule outcome.
- `+"`forwarder_forward_latency_seconds{api_type}`"+`: request duration, connect to last byte.
- `+"`forwarder_end_to_end_latency_seconds{api_type}`"+`: from row creation to its recorded SUCCESS.
- `+"`forwarder_mapping_errors_total{api_type}`"+`: messages not sent because their mapping failed.
- `+"`forwarder_semaphore_available_permits`"+`: free request slots.

== Rule expressions

Rules are https://expr-lang.org[expr^] expressions, compiled at start-up (and by `+"`forwarder lint`"+`), over:

- `+"`status`"+` (int): the HTTP status, 0 when no reply came.
- `+"`headers`"+` (map of string): reply headers by canonical name (`+"`Retry-After`"+`), first value.
- `+"`body`"+`: the reply parsed as JSON (numbers are floats), nil when it is not JSON or longer than 64 KiB. Use `+"`body?.field`"+` so a nil body does not match instead of failing.
- `+"`error`"+` (string): the transport error (timeout, refused connection), empty when a reply came.

Setting `+"`rules`"+` replaces the defaults, which implement the platform's contract: errcode "4" (string or number) is a duplicate, errcode "998" must not be resent, result 0 is a success, everything else is retried.`).
		Fields(
			service.NewStringField(hfFieldDSN).
				Description("PostgreSQL connection string (libpq URL or key=value) of the outbox, where outcomes are recorded.").
				Example("postgres://forwarder@localhost:5432/forwarder?sslmode=disable").
				Secret(),
			service.NewInterpolatedStringField(hfFieldURL).
				Description("The URL to POST each message to, interpolated per message.").
				Example(`${PLATFORM_URL}${! if meta("api_type") == "HEARTBEAT" { "/mch/heartbeat" } else { "/mch/business" } }`),
			service.NewInterpolatedStringMapField(hfFieldHeaders).
				Description("Request headers, interpolated per message. `Content-Type: application/json` is sent unless set here.").
				Example(map[string]any{"X-Request-Id": `${! meta("message_key") }`}).
				Default(map[string]any{}).
				Advanced(),
			service.NewDurationField(hfFieldTimeout).
				Description("Limit on one request, from connecting to the last byte of the reply (`FORWARD_TIMEOUT`). Must be less than `lease`.").
				Default(defaultTimeout),
			service.NewIntField(hfFieldMaxInFlight).
				Description("Requests in flight at once, over all batches of this output (`FORWARD_MAX_IN_FLIGHT`). Also the number of concurrent batches and of idle keep-alive connections kept.").
				Default(100),
			service.NewTLSToggledField(hfFieldTLS),
			service.NewStringField(hfFieldAccessName).
				Description("The platform's `access_name`, added to every request body (`PLATFORM_ACCESS_NAME`). Required at start-up; `forwarder lint` passes without it.").
				Default("").
				Secret(),
			service.NewStringField(hfFieldAccessPwd).
				Description("The platform's `access_pwd`, added to every request body (`PLATFORM_ACCESS_PWD`). Required at start-up; `forwarder lint` passes without it.").
				Default("").
				Secret(),
			service.NewObjectListField(hfFieldRules,
				service.NewStringField(hfFieldRuleWhen).
					Description("An expr expression over `status`, `headers`, `body` and `error` that must give a boolean.").
					Example(`status == 200 && body?.code == "OK"`),
				service.NewStringEnumField(hfFieldRuleOutcome, outcomes...).
					Description("What a reply matching `when` means: `success` or `duplicate` (SUCCESS), `no_retry` (FAILED), `retry` (PENDING, FAILED at `retry.max_attempts`)."),
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
				Description("The claim lease of the feeding `outbox_retry` input (`CLAIM_LEASE`). When set, start-up fails unless `timeout` is less than it, so that a request never outlives its claim. Empty means unchecked.").
				Example("60s").
				Default(""),
			service.NewBatchPolicyField(hfFieldBatching),
		).
		LintRule(leaseLintRule).
		Example("Forward to the platform", "The output of `pipelines/forwarder.yaml`: every tunable from the environment.", exampleForwardYAML).
		Example("Custom rules", "A platform that answers `{\"code\": \"OK\"}`, reports duplicates with a 409 and rejects with a 400 or 422.", exampleRulesYAML)
}

const exampleForwardYAML = `
output:
  http_forwarder:
    dsn: ${DATABASE_URL:postgres://localhost:5432/forwarder}
    url: '${PLATFORM_URL:http://localhost:8080}${! if meta("api_type") == "HEARTBEAT" { "/mch/heartbeat" } else { "/mch/business" } }'
    timeout: ${FORWARD_TIMEOUT:10s}
    max_in_flight: ${FORWARD_MAX_IN_FLIGHT:100}
    access_name: ${PLATFORM_ACCESS_NAME:}
    access_pwd: ${PLATFORM_ACCESS_PWD:}
    lease: ${CLAIM_LEASE:60s}
    retry:
      initial: ${FORWARD_RETRY_INITIAL:5s}
      max: ${FORWARD_RETRY_MAX:300s}
      max_attempts: ${FORWARD_MAX_ATTEMPTS:5}
`

const exampleRulesYAML = `
output:
  http_forwarder:
    dsn: ${DATABASE_URL:postgres://localhost:5432/forwarder}
    url: ${PLATFORM_URL:http://localhost:8080}/events
    access_name: ${PLATFORM_ACCESS_NAME:}
    access_pwd: ${PLATFORM_ACCESS_PWD:}
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
			// batches still fill every slot. The shared semaphore, not the
			// engine, bounds the requests.
			return out, policy, out.sem.size(), nil
		})
}

// httpForwarder is the http_forwarder output.
type httpForwarder struct {
	log *service.Logger

	dsn     string
	url     *service.InterpolatedString
	headers map[string]*service.InterpolatedString
	// staticHeader is shared by every request when no header is
	// interpolated (the client never changes a request's headers).
	staticHeader http.Header
	timeout      time.Duration
	rules        ruleSet
	backoff      backoff
	maxAttempts  int
	rnd          func() float64

	transport *http.Transport
	client    *http.Client
	sem       *semaphore
	// credPrefix opens every request body: `{"access_name":…,"access_pwd":…`.
	credPrefix []byte
	scrubber   *strings.Replacer

	connMu sync.Mutex
	pool   atomic.Pointer[pgxpool.Pool]

	mAttempts      *service.MetricCounter
	mLatency       *service.MetricTimer
	mEndToEnd      *service.MetricTimer
	mMappingErrors *service.MetricCounter
}

func newHTTPForwarderFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*httpForwarder, error) {
	h := &httpForwarder{log: mgr.Logger(), rnd: rand.Float64}
	var err error

	if h.dsn, err = conf.FieldString(hfFieldDSN); err != nil {
		return nil, err
	}
	if _, err := outboxdb.ParsePoolConfig(h.dsn, outboxdb.PoolConfig{}); err != nil {
		return nil, fmt.Errorf("field %s: %w", hfFieldDSN, err)
	}
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
	if err := checkLease(conf, h.timeout); err != nil {
		return nil, err
	}
	maxInFlight, err := conf.FieldInt(hfFieldMaxInFlight)
	if err != nil {
		return nil, err
	}
	if maxInFlight < 1 {
		return nil, fmt.Errorf("field %s: must be at least 1, got %d", hfFieldMaxInFlight, maxInFlight)
	}

	name, err := conf.FieldString(hfFieldAccessName)
	if err != nil {
		return nil, err
	}
	pwd, err := conf.FieldString(hfFieldAccessPwd)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, errors.New("access_name is empty: set PLATFORM_ACCESS_NAME")
	}
	if pwd == "" {
		return nil, errors.New("access_pwd is empty: set PLATFORM_ACCESS_PWD")
	}
	h.credPrefix, h.scrubber = credentials(name, pwd)

	if h.rules, err = parseRules(conf); err != nil {
		return nil, err
	}
	if h.backoff, h.maxAttempts, err = parseRetry(conf); err != nil {
		return nil, err
	}

	tlsConf, tlsEnabled, err := conf.FieldTLSToggled(hfFieldTLS)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1 with keep-alive and as many idle connections as slots: Go's
	// default of 2 idle connections per host cost 15-20 % at 64 in flight,
	// and cleartext HTTP/2 was 35-50 % slower than HTTP/1.1 on loopback.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	h.transport = &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: h.timeout, KeepAlive: 30 * time.Second}).DialContext,
		Protocols:             protocols,
		MaxIdleConns:          maxInFlight,
		MaxIdleConnsPerHost:   maxInFlight,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   h.timeout,
		ExpectContinueTimeout: time.Second,
	}
	if tlsEnabled {
		h.transport.TLSClientConfig = tlsConf
	}
	h.client = &http.Client{
		Transport: h.transport,
		// A redirect is classified like any reply, never followed: following
		// it would send the credentials in the body to another address.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}

	m := mgr.Metrics()
	h.mAttempts = m.NewCounter("forwarder_attempts_total", "api_type", "outcome")
	h.mLatency = m.NewTimer("forwarder_forward_latency_seconds", "api_type")
	h.mEndToEnd = m.NewTimer("forwarder_end_to_end_latency_seconds", "api_type")
	h.mMappingErrors = m.NewCounter("forwarder_mapping_errors_total", "api_type")
	h.sem = newSemaphore(maxInFlight, m.NewGauge("forwarder_semaphore_available_permits"))
	return h, nil
}

// checkLease enforces CONTRACT §3: CLAIM_LEASE must exceed FORWARD_TIMEOUT.
func checkLease(conf *service.ParsedConfig, timeout time.Duration) error {
	s, err := conf.FieldString(hfFieldLease)
	if err != nil || s == "" {
		return err
	}
	lease, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("field %s: %q is not a duration: %w", hfFieldLease, s, err)
	}
	return leaseError(timeout, lease)
}

func leaseError(timeout, lease time.Duration) error {
	if timeout >= lease {
		return fmt.Errorf("timeout (%v) must be less than lease (%v): CLAIM_LEASE must exceed FORWARD_TIMEOUT, or a request could outlive its claim", timeout, lease)
	}
	return nil
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

// credentials builds the request body prefix that carries them and a
// replacer that blanks them (raw and JSON-escaped) out of any text.
func credentials(name, pwd string) (prefix []byte, scrubber *strings.Replacer) {
	qName, _ := json.Marshal(name)
	qPwd, _ := json.Marshal(pwd)
	prefix = fmt.Appendf(nil, `{"access_name":%s,"access_pwd":%s`, qName, qPwd)
	var pairs []string
	for _, s := range []string{name, pwd, string(qName[1 : len(qName)-1]), string(qPwd[1 : len(qPwd)-1])} {
		if s != "" {
			pairs = append(pairs, s, "[redacted]")
		}
	}
	return prefix, strings.NewReplacer(pairs...)
}

// Connect opens the database pool; it is safe to call again.
func (h *httpForwarder) Connect(ctx context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if h.pool.Load() != nil {
		return nil
	}
	pool, err := outboxdb.OpenMigrated(ctx, h.dsn, outboxdb.PoolConfig{ApplicationName: "forwarder-http-forwarder", NoSeqScan: true})
	if err != nil {
		return err
	}
	h.pool.Store(pool)
	return nil
}

// attempt is one message of a batch on its way through the output.
type attempt struct {
	meta   rowMeta
	url    string
	header http.Header
	body   []byte
	// buildErr is an interpolation error of url or headers: the request is
	// not made and the rules see it as the transport error.
	buildErr string

	// done marks a message settled without a request (or interrupted).
	done bool
	// outcome is the rule outcome of the reply, "" when none was classified.
	outcome string
	result  outboxdb.Result
}

// WriteBatch sends the batch's messages concurrently within the shared
// request slots, then records every outcome in one statement. It returns nil
// once the outcomes are recorded, whatever they are; an error when the
// database write fails; and a batch error for messages that carry no claim
// metadata (they cannot be recorded, so they are nacked).
func (h *httpForwarder) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	pool := h.pool.Load()
	if pool == nil {
		return service.ErrNotConnected
	}

	var batchErr *service.BatchError
	atts := make([]*attempt, 0, len(batch))
	seen := make(map[int64]struct{}, len(batch))
	for i, msg := range batch {
		meta, err := readRowMeta(msg)
		if err == nil {
			if _, dup := seen[meta.id]; dup {
				err = fmt.Errorf("outbox row %d appears twice in one batch", meta.id)
			}
			seen[meta.id] = struct{}{}
		}
		if err != nil {
			if batchErr == nil {
				batchErr = service.NewBatchError(batch, errors.New("http_forwarder: messages without a valid outbox claim cannot be forwarded"))
			}
			batchErr.Failed(i, err)
			continue
		}
		a := &attempt{meta: meta}
		h.prepare(a, msg)
		atts = append(atts, a)
	}

	var wg sync.WaitGroup
	for _, a := range atts {
		if a.done {
			continue
		}
		if err := h.sem.acquire(ctx); err != nil {
			h.undo(a, "not sent: the output is stopping")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.sem.release()
			h.send(ctx, a)
		}()
	}
	wg.Wait()

	if err := h.record(ctx, pool, atts); err != nil {
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
		h.mMappingErrors.Incr(1, a.meta.apiLabel())
		a.done = true
		a.result = outboxdb.Result{Status: outboxdb.StatusFailed, Error: h.scrub(reason)}
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
	if a.body, err = h.requestBody(raw); err != nil {
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

// requestBody adds the credentials as the first keys of the mapped JSON
// object, without re-encoding it.
func (h *httpForwarder) requestBody(mapped []byte) ([]byte, error) {
	rest := bytes.TrimLeft(mapped, " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return nil, errors.New("the mapped body is not a JSON object")
	}
	rest = rest[1:]
	out := make([]byte, 0, len(h.credPrefix)+1+len(rest))
	out = append(out, h.credPrefix...)
	if inner := bytes.TrimLeft(rest, " \t\r\n"); len(inner) > 0 && inner[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...), nil
}

// send makes one request, holding a slot, and turns its reply into a result.
func (h *httpForwarder) send(ctx context.Context, a *attempt) {
	if until := time.Until(a.meta.leaseExpires); !a.meta.leaseExpires.IsZero() && until < h.timeout+resultMargin {
		h.undo(a, fmt.Sprintf("not sent: the claim lease ends in %v, before the %v request timeout and the result write could", until.Round(time.Millisecond), h.timeout))
		return
	}

	start := time.Now()
	env, raw, retryAfterHeader := h.do(ctx, a)
	took := time.Since(start)
	if ctx.Err() != nil && env.Status == 0 {
		// Stopping, not a platform failure. The request may have reached the
		// platform, so the attempt counts; the row is due again at once.
		a.done = true
		a.result = outboxdb.Result{Status: outboxdb.StatusPending, Sent: true, Duration: took,
			Error: "not finished: the output stopped during the request"}
		return
	}

	outcome, ruleIdx, runErr := h.rules.classify(&env)
	if runErr != nil {
		h.log.Debugf("outbox row %d: %v", a.meta.id, runErr)
	}
	api := a.meta.apiLabel()
	h.mAttempts.Incr(1, api, outcome)
	h.mLatency.Timing(took.Nanoseconds(), api)

	a.outcome = outcome
	a.result = outboxdb.Result{
		Sent:            a.buildErr == "",
		Duration:        took,
		HTTPStatus:      env.Status,
		PlatformErrcode: platformErrcode(env.Body),
	}
	switch outcome {
	case outcomeSuccess, outcomeDuplicate:
		a.result.Status = outboxdb.StatusSuccess
		return
	}
	what := h.scrub(describeReply(env, raw))
	switch outcome {
	case outcomeNoRetry:
		a.result.Status = outboxdb.StatusFailed
		a.result.Error = fmt.Sprintf("not retried (rules[%d] no_retry): %s", ruleIdx, what)
	default:
		if a.meta.attempt >= h.maxAttempts {
			a.result.Status = outboxdb.StatusFailed
			a.result.Error = fmt.Sprintf("giving up after %d attempts: %s", a.meta.attempt, what)
			break
		}
		a.result.Status = outboxdb.StatusPending
		a.result.RetryIn = h.retryDelay(a.meta.attempt, env.Status, retryAfterHeader)
		a.result.Error = what
	}
}

// do makes the request and reads the reply, within the request timeout. raw
// is the start of the reply's body.
func (h *httpForwarder) do(ctx context.Context, a *attempt) (env ruleEnv, raw []byte, retryAfterHeader string) {
	if a.buildErr != "" {
		env.Error = h.scrub(a.buildErr)
		return
	}
	reqCtx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, a.url, bytes.NewReader(a.body))
	if err != nil {
		env.Error = h.scrub("building the request: " + err.Error())
		return
	}
	req.Header = a.header
	resp, err := h.client.Do(req)
	if err != nil {
		env.Error = h.transportError(ctx, reqCtx, err)
		return
	}
	defer resp.Body.Close()
	env.Status = resp.StatusCode
	retryAfterHeader = resp.Header.Get("Retry-After")
	if h.rules.usesHeaders {
		env.Headers = make(map[string]string, len(resp.Header))
		for k, vs := range resp.Header {
			if len(vs) > 0 {
				env.Headers[k] = vs[0]
			}
		}
	}

	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		env.Error = "reading the reply: " + h.transportError(ctx, reqCtx, err)
	}
	truncated := len(b) > maxResponseBytes
	if truncated {
		b = b[:maxResponseBytes]
		// Drain a little more so the connection can be reused; a reply
		// longer than that closes it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))
	}
	if err == nil && !truncated && len(b) > 0 {
		var v any
		if json.Unmarshal(b, &v) == nil {
			env.Body = v
		}
	}
	return env, b, retryAfterHeader
}

func (h *httpForwarder) transportError(ctx, reqCtx context.Context, err error) string {
	if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("request timed out after %v", h.timeout)
	}
	return h.scrub(err.Error())
}

// undo gives a claim back unsent: the row is due again at once and the
// attempt does not count (otherwise a row on its last attempt would be failed
// by the next claim without ever being sent).
func (h *httpForwarder) undo(a *attempt, why string) {
	a.done = true
	a.result = outboxdb.Result{Status: outboxdb.StatusPending, Undo: true, Error: why}
}

func (h *httpForwarder) retryDelay(attempt, status int, retryAfterHeader string) time.Duration {
	if honoursRetryAfter(status) {
		if d, ok := retryAfter(retryAfterHeader, time.Now()); ok {
			return min(d, h.backoff.max)
		}
	}
	return h.backoff.delay(attempt, h.rnd())
}

func (h *httpForwarder) scrub(s string) string { return h.scrubber.Replace(s) }

// record writes the batch's outcomes, then logs and counts the recorded ones.
func (h *httpForwarder) record(ctx context.Context, pool *pgxpool.Pool, atts []*attempt) error {
	if len(atts) == 0 {
		return nil
	}
	results := make([]outboxdb.Result, len(atts))
	for i, a := range atts {
		results[i] = a.result
		results[i].ID = a.meta.id
		results[i].ClaimToken = a.meta.token
	}
	// Requests were made: their outcomes are written even when the batch's
	// context is cancelled. The write is fenced and idempotent, so retrying
	// it after a connection error is safe.
	// Keep trying while the claims hold: a result given up on while the
	// database is briefly away means the platform gets the message again.
	deadline := time.Now().Add(recordTimeout)
	for _, a := range atts {
		if le := a.meta.leaseExpires; !le.IsZero() && le.After(time.Now()) && le.Before(deadline) {
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
		if recorded, err = outboxdb.RecordResults(rctx, pool, results); err == nil {
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
	h.announceRetries(atts, ok)
	for _, a := range atts {
		r := a.result
		if _, done := ok[a.meta.id]; !done {
			h.log.Warnf("Outbox row %d (key %s): result of attempt %d not recorded: the claim was lost (lease expired and the row was claimed again, or it was finished)", a.meta.id, a.meta.key, a.meta.attempt)
			continue
		}
		h.log.Debugf("Outbox row %d (key %s) attempt %d: %s, outcome %q, http %d, platform errcode %q, retry in %v: %s",
			a.meta.id, a.meta.key, a.meta.attempt, r.Status, a.outcome, r.HTTPStatus, r.PlatformErrcode, r.RetryIn, r.Error)
		switch {
		case r.Undo:
			h.log.Warnf("Outbox row %d (key %s) given back unsent: %s", a.meta.id, a.meta.key, r.Error)
		case r.Status == outboxdb.StatusSuccess:
			if !a.meta.createdAt.IsZero() {
				h.mEndToEnd.Timing(time.Since(a.meta.createdAt).Nanoseconds(), a.meta.apiLabel())
			}
		case r.Status == outboxdb.StatusFailed:
			h.log.Warnf("Outbox row %d (key %s) FAILED at attempt %d (platform errcode %q): %s", a.meta.id, a.meta.key, a.meta.attempt, r.PlatformErrcode, r.Error)
		}
	}
	return nil
}

// announceRetries tells the dispatcher of this process (see handoff) when
// the earliest retry just recorded is due, so that it claims it on time
// without polling for it.
func (h *httpForwarder) announceRetries(atts []*attempt, recorded map[int64]struct{}) {
	var (
		first time.Duration
		found bool
	)
	for _, a := range atts {
		if _, done := recorded[a.meta.id]; !done || a.result.Status != outboxdb.StatusPending {
			continue
		}
		if !found || a.result.RetryIn < first {
			first, found = a.result.RetryIn, true
		}
	}
	if found {
		handoff.NoteDue(h.dsn, time.Now().Add(first))
	}
}

// Close closes the database pool and idle connections.
func (h *httpForwarder) Close(context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if p := h.pool.Swap(nil); p != nil {
		p.Close()
	}
	h.transport.CloseIdleConnections()
	return nil
}

// describeReply says what came back, for last_error.
func describeReply(env ruleEnv, raw []byte) string {
	snippet := string(raw[:min(len(raw), maxSnippetBytes)])
	if len(raw) > maxSnippetBytes {
		snippet += "…"
	}
	switch {
	case env.Status == 0:
		return env.Error
	case env.Error != "":
		return fmt.Sprintf("http %d: %s", env.Status, env.Error)
	case snippet == "":
		return fmt.Sprintf("http %d (empty body)", env.Status)
	default:
		return fmt.Sprintf("http %d: %s", env.Status, snippet)
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

// rowMeta is the claim a message carries.
type rowMeta struct {
	id           int64
	token        string
	attempt      int
	apiType      string
	key          string
	createdAt    time.Time // zero when unknown
	leaseExpires time.Time // zero when unknown
}

func (m rowMeta) apiLabel() string {
	if m.apiType == "" {
		return "unknown"
	}
	return m.apiType
}

func readRowMeta(msg *service.Message) (m rowMeta, err error) {
	required := func(key string) (string, error) {
		v, ok := msg.MetaGet(key)
		if !ok || v == "" {
			return "", fmt.Errorf("metadata %s is missing: http_forwarder must be fed by the outbox_retry input", key)
		}
		return v, nil
	}
	intMeta := func(key, v string) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("metadata %s: %q is not an integer", key, v)
		}
		return n, nil
	}

	v, err := required(metaOutboxID)
	if err != nil {
		return m, err
	}
	if m.id, err = intMeta(metaOutboxID, v); err != nil {
		return m, err
	}
	if m.token, err = required(metaClaimToken); err != nil {
		return m, err
	}
	if v, err = required(metaAttempt); err != nil {
		return m, err
	}
	attempt, err := intMeta(metaAttempt, v)
	if err != nil {
		return m, err
	}
	if attempt < 1 {
		return m, fmt.Errorf("metadata %s: %d is not a 1-based attempt number", metaAttempt, attempt)
	}
	m.attempt = int(attempt)
	m.apiType, _ = msg.MetaGet(metaAPIType)
	m.key, _ = msg.MetaGet(metaMessageKey)
	if v, ok := msg.MetaGet(metaCreatedAtMs); ok && v != "" {
		ms, err := intMeta(metaCreatedAtMs, v)
		if err != nil {
			return m, err
		}
		m.createdAt = time.UnixMilli(ms)
	}
	if v, ok := msg.MetaGet(metaLeaseExpiresAtMs); ok && v != "" {
		ms, err := intMeta(metaLeaseExpiresAtMs, v)
		if err != nil {
			return m, err
		}
		m.leaseExpires = time.UnixMilli(ms)
	}
	return m, nil
}

// semaphore bounds the requests in flight over every batch of one output and
// publishes its free slots.
type semaphore struct {
	slots chan struct{}
	mu    sync.Mutex // orders the gauge updates, so the last one is current
	gauge *service.MetricGauge
}

func newSemaphore(n int, gauge *service.MetricGauge) *semaphore {
	s := &semaphore{slots: make(chan struct{}, n), gauge: gauge}
	s.report()
	return s
}

func (s *semaphore) size() int { return cap(s.slots) }

func (s *semaphore) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		s.report()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *semaphore) release() {
	<-s.slots
	s.report()
}

func (s *semaphore) report() {
	s.mu.Lock()
	s.gauge.Set(int64(cap(s.slots) - len(s.slots)))
	s.mu.Unlock()
}
