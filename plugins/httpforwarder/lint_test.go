package httpforwarder

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Output, Name: "http_forwarder", Spec: httpForwarderSpec(),
		Base: "dsn: postgres://localhost/forwarder\nurl: http://localhost:8080/mch/business\naccess_name: n\naccess_pwd: p\n",
		Build: func(conf *service.ParsedConfig) error {
			_, err := parseConfig(conf)
			return err
		}}.Run(t, []linttest.Case{
		{Name: "TimeoutBelowAMillisecond", YAML: "timeout: 999us", Want: "field timeout: must be at least 1ms, got 999µs (FORWARD_TIMEOUT)"},
		{Name: "TimeoutNotADuration", YAML: "timeout: 10", Want: "failed to parse 'timeout' as a duration string"},
		{Name: "TimeoutAMillisecond", YAML: "timeout: 1ms"},
		{Name: "TimeoutFromAVariable", YAML: "timeout: ${LINT_TEST_TIMEOUT:0s}", Want: "field timeout: must be at least 1ms, got 0s"},
		{Name: "TimeoutFromAVariableSet", YAML: "timeout: ${LINT_TEST_TIMEOUT:0s}", Env: map[string]string{"LINT_TEST_TIMEOUT": "10s"}},
		{Name: "MaxInFlightZero", YAML: "max_in_flight: 0", Want: "field max_in_flight: must be from 1 to 10000, got 0 (FORWARD_MAX_IN_FLIGHT)"},
		{Name: "MaxInFlightAboveTheBound", YAML: "max_in_flight: 10001", Want: "field max_in_flight: must be from 1 to 10000, got 10001"},
		{Name: "MaxInFlightOne", YAML: "max_in_flight: 1"},
		{Name: "MaxInFlightLargest", YAML: "max_in_flight: 10000"},
		{Name: "LeaseNotADuration", YAML: "lease: a minute", Want: `field lease: "a minute" is not a duration`},
		{Name: "LeaseAboveTimeout", YAML: "timeout: 10s\nlease: 10001ms"},
		{Name: "OutcomeCase", YAML: "rules:\n  - when: 'status == 200'\n    outcome: SUCCESS", Want: `rules[0]: outcome "SUCCESS" is not one of success`},
		{Name: "RetryInitialNegative", YAML: "retry:\n  initial: -1ns", Want: "field retry.initial: must not be negative, got -1ns"},
		{Name: "RetryInitialZero", YAML: "retry:\n  initial: 0s"},
		{Name: "RetryMaxBelowInitial", YAML: "retry:\n  initial: 5s\n  max: 4s", Want: "field retry.max (4s) must not be less than retry.initial (5s)"},
		{Name: "RetryMaxBelowDefaultInitial", YAML: "retry:\n  max: 1s", Want: "field retry.max (1s) must not be less than retry.initial (5s)"},
		{Name: "RetryMaxIsInitial", YAML: "retry:\n  initial: 5s\n  max: 5s"},
		{Name: "RetryMaxNotADuration", YAML: "retry:\n  max: 5 minutes", Want: "failed to parse 'retry.max' as a duration string"},
		{Name: "RetryMultiplierBelowOne", YAML: "retry:\n  multiplier: 0.99", Want: "field retry.multiplier: must be at least 1, got 0.99"},
		{Name: "RetryMultiplierOne", YAML: "retry:\n  multiplier: 1"},
		{Name: "RetryMultiplierNaN", YAML: "retry:\n  multiplier: .nan", Want: "field retry.multiplier: must be at least 1, got NaN"},
		{Name: "RetryJitterNaN", YAML: "retry:\n  jitter: .nan", Want: "field retry.jitter: must be in [0, 1), got NaN"},
		{Name: "RetryJitterNegative", YAML: "retry:\n  jitter: -0.1", Want: "field retry.jitter: must be in [0, 1), got -0.1"},
		{Name: "RetryJitterOne", YAML: "retry:\n  jitter: 1", Want: "field retry.jitter: must be in [0, 1), got 1"},
		{Name: "RetryJitterZero", YAML: "retry:\n  jitter: 0"},
		{Name: "RetryJitterBelowOne", YAML: "retry:\n  jitter: 0.999"},
		{Name: "RetryMaxAttemptsZero", YAML: "retry:\n  max_attempts: 0", Want: "field retry.max_attempts: must be from 1 to 2147483647 (a row counts its attempts in an integer column), got 0"},
		{Name: "RetryMaxAttemptsBeyondTheColumn", YAML: "retry:\n  max_attempts: 2147483648", Want: "got 2147483648 (FORWARD_MAX_ATTEMPTS)"},
		{Name: "RetryMaxAttemptsBoundaries", YAML: "retry:\n  max_attempts: 2147483647"},
		{Name: "RetryMaxAttemptsOne", YAML: "retry:\n  max_attempts: 1"},
		{Name: "ProbeIntervalZero", YAML: "probe_interval: 0s", Want: "field probe_interval: must be at least 1ms, got 0s (PLATFORM_PROBE_INTERVAL)"},
		{Name: "ProbeIntervalBelowAMillisecond", YAML: "probe_interval: 999us", Want: "field probe_interval: must be at least 1ms, got 999µs (PLATFORM_PROBE_INTERVAL): the instances space their probes in whole milliseconds"},
		{Name: "ProbeIntervalAMillisecond", YAML: "probe_interval: 1ms"},
		{Name: "RateLimitNegative", YAML: "rate_limit: -0.5", Want: "field rate_limit: must be a number of at least 0, got -0.5 (FORWARD_RATE_LIMIT)"},
		{Name: "RateLimitInfinite", YAML: "rate_limit: .inf", Want: "field rate_limit: must be a number of at least 0, got +Inf"},
		{Name: "RateLimitNaN", YAML: "rate_limit: .nan", Want: "field rate_limit: must be a number of at least 0, got NaN"},
		{Name: "RateLimitZero", YAML: "rate_limit: 0"},
		{Name: "RateLimitLargest", YAML: "rate_limit: 1.7976931348623157e308"},
		{Name: "BreakerWindowZero", YAML: "breaker:\n  window: 0s", Want: "field breaker.window: must be positive, got 0s"},
		{Name: "BreakerSilenceNegative", YAML: "breaker:\n  silence: -1s", Want: "field breaker.silence: must be positive, got -1s"},
		{Name: "BreakerMessagesZero", YAML: "breaker:\n  messages: 0", Want: "fields breaker.messages and breaker.half_open_messages must be at least 1"},
		{Name: "BreakerHalfOpenZero", YAML: "breaker:\n  half_open_messages: 0", Want: "fields breaker.messages and breaker.half_open_messages must be at least 1"},
		{Name: "BreakerSmallest", YAML: "breaker:\n  window: 1ns\n  silence: 1ns\n  messages: 1\n  half_open_messages: 1"},
	})
}
