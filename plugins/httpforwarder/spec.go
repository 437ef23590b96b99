package httpforwarder

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
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

const defaultTimeout = "10s"

var httpForwarderSpec = sync.OnceValue(func() *service.ConfigSpec {
	defaultRulesConf := make([]any, len(defaultRules))
	for i, r := range defaultRules {
		defaultRulesConf[i] = map[string]any{hfFieldRuleWhen: r.When, hfFieldRuleOutcome: r.Outcome}
	}
	return service.NewConfigSpec().
		Beta().
		Categories("Network").
		Summary("POSTs claimed outbox rows to the parking platform, classifies each reply with expr rules and records the outcome of every attempt in PostgreSQL.").
		Description(`
Meant to be fed by the `+"`outbox_retry`"+` input through a mapping that turns the stored payload into the platform's JSON request. Each message must carry the input's metadata: `+"`outbox_id`, `claim_token`, `attempt`"+` (required), `+"`api_type`, `message_key`, `outbox_created_at_ms`, `lease_expires_at_ms`, `previous_failure_at_ms`"+` (optional).

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

- *Circuit breaker, shared by every instance on the database.* When failures span `+"`breaker.messages`"+` distinct messages and the platform has answered nothing for `+"`breaker.silence`"+`, on this instance or any other (each announces its latest healthy reply to the others through the database, once a second), the breaker opens, in PostgreSQL, and every instance stops sending within a second: rows stay PENDING and keep their attempts (claims held when it opened are given back unsent), new rows are not claimed. Only probes go: at most one per `+"`probe_interval`"+` across all instances, each carrying a message not failing on its own (never attempted first, never the same row twice in a row). A healthy probe half-opens it: sending resumes with concurrency ramping up from one; `+"`breaker.half_open_messages`"+` distinct messages answered close it, and one message's failures never reopen it. A failed probe never spends its row's attempt. A failed attempt counts only while the platform is evidently up (it answered another message within `+"`breaker.window`"+`, and since this message last failed): an outage of any length leaves no row FAILED, while a message the platform always fails ends FAILED after its attempts and never slows the others.
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
- `+"`forwarder_delivery_paused`"+` (1 while this instance holds delivery for an operator's pause, `+"`forwarder outbox pause`"+`), `+"`forwarder_delivery_pause_started_timestamp_seconds`"+`, `+"`forwarder_delivery_pause_end_timestamp_seconds`"+` (0: until resumed).

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
				Description("Limit on one request, from connecting to the last byte of the reply (`FORWARD_TIMEOUT`). At least `1ms`, and less than the `lease` of the stream's `outbox_retry` input (`CLAIM_LEASE`).").
				Default(defaultTimeout).
				LintRule(fieldlint.Duration(hfFieldTimeout, checkTimeout)),
			service.NewIntField(hfFieldMaxInFlight).
				Description("Requests in flight at once, over all batches of this output (`FORWARD_MAX_IN_FLIGHT`). Also the number of concurrent batches and of idle keep-alive connections kept. From 1 to 10000.").
				Default(100).
				LintRule(fieldlint.Int(checkMaxInFlight)),
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
					Default("5s").
					LintRule(fieldlint.Duration(retryField(hfFieldRetryInitial), checkRetryInitial)),
				service.NewDurationField(hfFieldRetryMax).
					Description("Cap on any retry delay, `Retry-After` included (`FORWARD_RETRY_MAX`).").
					Default("300s").
					LintRule(fieldlint.Duration(retryField(hfFieldRetryMax), func(time.Duration) error { return nil })),
				service.NewFloatField(hfFieldRetryMultiplier).
					Description("Growth of the delay per attempt: delay = min(initial × multiplier^(attempt−1), max).").
					Default(2.0).
					LintRule(fieldlint.Float(checkRetryMultiplier)),
				service.NewFloatField(hfFieldRetryJitter).
					Description("Random spread of each delay, as a fraction of it: 0.1 is ±10 %.").
					Default(0.1).
					LintRule(fieldlint.Float(checkRetryJitter)),
				service.NewIntField(hfFieldRetryMaxAttempts).
					Description("Attempts before a retryable row becomes FAILED (`FORWARD_MAX_ATTEMPTS`), from 1 to 2147483647. An attempt the platform did not answer (5xx, timeout, connection error) ends the row only once its message has failed before and others were answered since, so that the start of an outage fails no row: with 1, such a message is sent twice.").
					Default(5).
					LintRule(fieldlint.Int(checkRetryMaxAttempts)),
			).Description("The retry schedule of rows whose reply is retryable.").
				LintRule(fieldlint.Rule(lintRetry)),
			service.NewStringField(hfFieldLease).
				Description("The claim lease of the feeding `outbox_retry` input, for an output whose input is in another stream. When set, start-up fails unless `timeout` is less than it. An `outbox_retry` input in the same stream is checked against without it.").
				Example("60s").
				Default("").
				LintRule(fieldlint.String(func(s string) error { _, err := parseLeaseField(s); return err })).
				Advanced(),
			service.NewDurationField(hfFieldProbeInterval).
				Description("While the breaker is open, at most one probe request per interval across every instance on the database (`PLATFORM_PROBE_INTERVAL`); at least `1ms`.").
				Default("5s").
				Example("${PLATFORM_PROBE_INTERVAL:5s}").
				LintRule(fieldlint.Duration(hfFieldProbeInterval, checkProbeInterval)),
			service.NewFloatField(hfFieldRateLimit).
				Description("Requests per second to the platform across every instance on the database (`FORWARD_RATE_LIMIT`); `0`: no limit.").
				Default(0).
				Example("${FORWARD_RATE_LIMIT:0}").
				LintRule(fieldlint.Float(checkRateLimit)),
			service.NewObjectField(hfFieldBreaker,
				service.NewDurationField(hfFieldBreakerWindow).Description("How far back replies count.").Default("10s").
					LintRule(fieldlint.Duration("breaker.window", checkBreakerWindow)),
				service.NewIntField(hfFieldBreakerMessages).Description("Distinct messages that must have found the platform unavailable since its last healthy reply before it is judged down; replies about one message count once.").Default(5).
					LintRule(breakerCountLintRule),
				service.NewDurationField(hfFieldBreakerSilence).Description("How long the platform must have answered no message, on any instance sharing the database, before the breaker opens.").Default("3s").
					LintRule(fieldlint.Duration("breaker.silence", checkBreakerSilence)),
				service.NewIntField(hfFieldBreakerHalfOpen).Description("Distinct messages answered healthy that close a half-open breaker.").Default(10).
					LintRule(breakerCountLintRule),
			).
				Description("When the platform is judged down (see Protecting the platform).").
				Advanced(),
			service.NewBatchPolicyField(hfFieldBatching),
		).
		LintRule(leaseLintRule).
		Example("Forward to the platform", "The output of `pipelines/forwarder.yaml`: every tunable from the environment; the database and the credentials are read from `DATABASE_URL`, `PLATFORM_ACCESS_NAME` and `PLATFORM_ACCESS_PWD` directly.", exampleForwardYAML).
		Example("Custom rules", "A platform that answers `{\"code\": \"OK\"}`, reports duplicates with a 409 and rejects with a 400 or 422.", exampleRulesYAML)
})

// breakerCountLintRule is the rule of breaker.messages and
// breaker.half_open_messages, which start-up checks together.
var breakerCountLintRule = fieldlint.Int(checkBreakerCount)

// The checks of single fields, which start-up runs on the parsed values and
// lint (fieldlint) on the values written, with the same words.
var (
	checkTimeout = fieldlint.Range(pluginconf.MinTimeout, fieldlint.MaxDuration,
		fmt.Sprintf("field %s: must be at least %v, got %%v (FORWARD_TIMEOUT): %s, nothing would be delivered", hfFieldTimeout, pluginconf.MinTimeout, pluginconf.MinTimeoutWhy))
	checkMaxInFlight = fieldlint.Range(1, pluginconf.MaxInFlight,
		fmt.Sprintf("field %s: must be from 1 to %d, got %%d (FORWARD_MAX_IN_FLIGHT): Benthos starts a goroutine for each, and the output keeps as many connections", hfFieldMaxInFlight, pluginconf.MaxInFlight))
	checkRetryInitial     = fieldlint.Range(0, fieldlint.MaxDuration, "field retry.initial: must not be negative, got %v")
	checkRetryMultiplier  = fieldlint.Range(1, math.MaxFloat64, "field retry.multiplier: must be at least 1, got %v")
	checkRetryMaxAttempts = fieldlint.Range(1, outboxdb.MaxAttemptsLimit,
		fmt.Sprintf("field retry.max_attempts: must be from 1 to %d (a row counts its attempts in an integer column), got %%d (FORWARD_MAX_ATTEMPTS)", outboxdb.MaxAttemptsLimit))
	checkProbeInterval = fieldlint.Range(pluginconf.MinProbeInterval, fieldlint.MaxDuration,
		fmt.Sprintf("field %s: must be at least %v, got %%v (PLATFORM_PROBE_INTERVAL): %s", hfFieldProbeInterval, pluginconf.MinProbeInterval, pluginconf.MinProbeIntervalWhy))
	checkRateLimit      = fieldlint.Range(0, math.MaxFloat64, "field "+hfFieldRateLimit+": must be a number of at least 0, got %v (FORWARD_RATE_LIMIT)")
	checkBreakerWindow  = fieldlint.Range(1, fieldlint.MaxDuration, "field breaker.window: must be positive, got %v")
	checkBreakerSilence = fieldlint.Range(1, fieldlint.MaxDuration, "field breaker.silence: must be positive, got %v")
)

func checkRetryJitter(j float64) error {
	if j < 0 || j >= 1 || math.IsNaN(j) {
		return fmt.Errorf("field retry.jitter: must be in [0, 1), got %v", j)
	}
	return nil
}

func checkBreakerCount(n int) error {
	if n < 1 {
		return errors.New("fields breaker.messages and breaker.half_open_messages must be at least 1")
	}
	return nil
}

// checkRetryDelays checks the retry pair: max not below initial.
func checkRetryDelays(initial, maxDelay time.Duration) error {
	if maxDelay < initial {
		return fmt.Errorf("field retry.max (%v) must not be less than retry.initial (%v) (FORWARD_RETRY_MAX, FORWARD_RETRY_INITIAL)", maxDelay, initial)
	}
	return nil
}

// parseLeaseField reads the lease field (not a Benthos duration field: it
// may be empty).
func parseLeaseField(s string) (time.Duration, error) {
	lease, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("field %s: %q is not a duration: %w", hfFieldLease, s, err)
	}
	return lease, nil
}

func retryField(name string) string { return hfFieldRetry + "." + name }

// lintRetry checks the retry object (defaults filled in) as parseRetry
// does for its pair: max not below initial. Durations that do not parse
// are reported by their fields' rules.
func lintRetry(v any) []string {
	m, _ := v.(map[string]any)
	initial, ok1, err1 := fieldlint.ParseDuration(retryField(hfFieldRetryInitial), m[hfFieldRetryInitial])
	maxDelay, ok2, err2 := fieldlint.ParseDuration(retryField(hfFieldRetryMax), m[hfFieldRetryMax])
	if ok1 && ok2 && err1 == nil && err2 == nil && initial >= 0 {
		if err := checkRetryDelays(initial, maxDelay); err != nil {
			return []string{err.Error()}
		}
	}
	return nil
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
