package httpforwarder

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
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
	if err := checkTimeout(c.policy.timeout); err != nil {
		return c, err
	}
	if c.lease, err = parseLease(conf); err != nil {
		return c, err
	}
	if c.lease > 0 {
		if err := leaseError(c.policy.timeout, c.lease); err != nil {
			return c, err
		}
	}
	if err := checkMaxInFlight(c.maxInFlight); err != nil {
		return c, err
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
	return parseLeaseField(s)
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
	if err = cmp.Or(err, checkProbeInterval(c.ProbeInterval), checkRateLimit(c.RateLimit),
		checkBreakerWindow(c.Breaker.Window), checkBreakerSilence(c.Breaker.Silence),
		checkBreakerCount(c.Breaker.Messages), checkBreakerCount(c.Breaker.HalfOpenMessages)); err != nil {
		return c, err
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
	err = cmp.Or(checkRetryInitial(b.initial), checkRetryDelays(b.initial, b.max), checkRetryMultiplier(b.multiplier),
		checkRetryJitter(b.jitter), checkRetryMaxAttempts(maxAttempts))
	return
}
