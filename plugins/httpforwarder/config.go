package httpforwarder

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
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
	if c.url, err = conf.FieldInterpolatedString(hfFieldURL); err != nil {
		return c, err
	}
	if c.headers, err = conf.FieldInterpolatedStringMap(hfFieldHeaders); err != nil {
		return c, err
	}
	if c.policy.timeout, err = conf.FieldDuration(hfFieldTimeout); err != nil {
		return c, err
	}
	if c.policy.timeout <= 0 {
		return c, fmt.Errorf("field %s: must be positive, got %v", hfFieldTimeout, c.policy.timeout)
	}
	if c.lease, err = parseLease(conf); err != nil {
		return c, err
	}
	if c.lease > 0 {
		if err := leaseError(c.policy.timeout, c.lease); err != nil {
			return c, err
		}
	}
	if c.maxInFlight, err = conf.FieldInt(hfFieldMaxInFlight); err != nil {
		return c, err
	}
	if c.maxInFlight < 1 {
		return c, fmt.Errorf("field %s: must be at least 1, got %d", hfFieldMaxInFlight, c.maxInFlight)
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
	if c.batching, err = conf.FieldBatchPolicy(hfFieldBatching); err != nil {
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
