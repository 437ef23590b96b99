package httpforwarder

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/protection"
)

// config is the output's configuration, parsed and checked: everything a
// user can get wrong is refused here, naming the field, before anything
// is built.
type config struct {
	url     *service.InterpolatedString
	headers map[string]*service.InterpolatedString
	// lease, when set, is the claim lease of an input in another stream.
	lease       time.Duration
	maxInFlight int
	// accessName and accessPwd are the platform's credentials.
	accessName, accessPwd string
	policy                policy
	tls                   *tls.Config
	gate                  protection.Config
	batching              service.BatchPolicy
}

func parseConfig(conf *service.ParsedConfig) (c config, err error) {
	c.url = pluginconf.Field(&err, conf.FieldInterpolatedString, hfFieldURL)
	c.headers = pluginconf.Field(&err, conf.FieldInterpolatedStringMap, hfFieldHeaders)
	c.policy.timeout = pluginconf.Field(&err, conf.FieldDuration, hfFieldTimeout)
	c.maxInFlight = pluginconf.Field(&err, conf.FieldInt, hfFieldMaxInFlight)
	c.batching = pluginconf.Field(&err, conf.FieldBatchPolicy, hfFieldBatching)
	if err != nil {
		return c, err
	}
	if c.policy.timeout < minTimeout {
		return c, fmt.Errorf("field %s: must be at least %v, got %v (FORWARD_TIMEOUT): too short for a request to the platform, nothing would be delivered",
			hfFieldTimeout, minTimeout, c.policy.timeout)
	}
	if c.lease, err = parseLease(conf); err != nil {
		return c, err
	}
	if c.lease > 0 {
		if err := leaseError(c.policy.timeout, c.lease); err != nil {
			return c, err
		}
	}
	if c.maxInFlight < 1 || c.maxInFlight > pluginconf.MaxInFlight {
		return c, fmt.Errorf("field %s: must be from 1 to %d, got %d (FORWARD_MAX_IN_FLIGHT): Benthos starts a goroutine for each, and the output keeps as many connections",
			hfFieldMaxInFlight, pluginconf.MaxInFlight, c.maxInFlight)
	}
	if c.accessName, err = secretField(conf, hfFieldAccessName); err != nil {
		return c, err
	}
	if c.accessPwd, err = secretField(conf, hfFieldAccessPwd); err != nil {
		return c, err
	}
	if c.policy.rules, err = parseRules(conf); err != nil {
		return c, err
	}
	if c.policy.backoff, c.policy.maxAttempts, err = parseRetry(conf); err != nil {
		return c, err
	}
	c.policy.rnd = rand.Float64
	tlsConf, tlsEnabled, err := conf.FieldTLSToggled(hfFieldTLS)
	if err != nil {
		return c, err
	}
	if tlsEnabled {
		c.tls = tlsConf
	}
	if c.gate, err = parseGate(conf, c.maxInFlight); err != nil {
		return c, err
	}
	return c, nil
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

func parseGate(conf *service.ParsedConfig, maxInFlight int) (c protection.Config, err error) {
	c.MaxInFlight = maxInFlight
	c.ProbeInterval = pluginconf.Field(&err, conf.FieldDuration, hfFieldProbeInterval)
	c.RateLimit = pluginconf.Field(&err, conf.FieldFloat, hfFieldRateLimit)
	b := conf.Namespace(hfFieldBreaker)
	c.Breaker.Window = pluginconf.Field(&err, b.FieldDuration, hfFieldBreakerWindow)
	c.Breaker.Messages = pluginconf.Field(&err, b.FieldInt, hfFieldBreakerMessages)
	c.Breaker.Silence = pluginconf.Field(&err, b.FieldDuration, hfFieldBreakerSilence)
	c.Breaker.HalfOpenMessages = pluginconf.Field(&err, b.FieldInt, hfFieldBreakerHalfOpen)
	switch {
	case err != nil:
		return c, err
	case c.ProbeInterval <= 0:
		return c, fmt.Errorf("field %s: must be positive, got %v (PLATFORM_PROBE_INTERVAL)", hfFieldProbeInterval, c.ProbeInterval)
	case !(c.RateLimit >= 0 && c.RateLimit <= math.MaxFloat64):
		return c, fmt.Errorf("field %s: must be a number of at least 0, got %v (FORWARD_RATE_LIMIT)", hfFieldRateLimit, c.RateLimit)
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
		specs[i].When = pluginconf.Field(&err, o.FieldString, hfFieldRuleWhen)
		specs[i].Outcome = pluginconf.Field(&err, o.FieldString, hfFieldRuleOutcome)
		if o.Contains(hfFieldRuleMessage) {
			specs[i].MessageSpecific = pluginconf.Field(&err, o.FieldBool, hfFieldRuleMessage)
		}
		if err != nil {
			return ruleSet{}, fmt.Errorf("rules[%d]: %w", i, err)
		}
	}
	return compileRules(specs)
}

func parseRetry(conf *service.ParsedConfig) (b backoff, maxAttempts int, err error) {
	r := conf.Namespace(hfFieldRetry)
	b.initial = pluginconf.Field(&err, r.FieldDuration, hfFieldRetryInitial)
	b.max = pluginconf.Field(&err, r.FieldDuration, hfFieldRetryMax)
	b.multiplier = pluginconf.Field(&err, r.FieldFloat, hfFieldRetryMultiplier)
	b.jitter = pluginconf.Field(&err, r.FieldFloat, hfFieldRetryJitter)
	maxAttempts = pluginconf.Field(&err, r.FieldInt, hfFieldRetryMaxAttempts)
	if err != nil {
		return
	}
	switch {
	case b.initial < 0:
		err = fmt.Errorf("field retry.initial: must not be negative, got %v", b.initial)
	case b.max < b.initial:
		err = fmt.Errorf("field retry.max (%v) must not be less than retry.initial (%v) (FORWARD_RETRY_MAX, FORWARD_RETRY_INITIAL)", b.max, b.initial)
	case b.multiplier < 1:
		err = fmt.Errorf("field retry.multiplier: must be at least 1, got %v", b.multiplier)
	case b.jitter < 0 || b.jitter >= 1:
		err = fmt.Errorf("field retry.jitter: must be in [0, 1), got %v", b.jitter)
	case maxAttempts < 1 || maxAttempts > outboxdb.MaxAttemptsLimit:
		err = fmt.Errorf("field retry.max_attempts: must be from 1 to %d (a row counts its attempts in an integer column), got %d (FORWARD_MAX_ATTEMPTS)",
			outboxdb.MaxAttemptsLimit, maxAttempts)
	}
	return
}
