package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/forwarder/forwarder/internal/envsecret"
)

// Field names shared by the input and the output.
const (
	kfFieldSeedBrokers = "seed_brokers"
	kfFieldClientID    = "client_id"
	kfFieldTLS         = "tls"
	kfFieldSASL        = "sasl"
	kfFieldSASLMech    = "mechanism"
	kfFieldSASLUser    = "username"
	kfFieldSASLPass    = "password"
	kfFieldMetadataAge = "metadata_max_age"
)

// franz-go's bounds of metadata_max_age: its minimum age between two
// metadata requests, and its ceiling.
const (
	minMetadataMaxAge = 5 * time.Second
	maxMetadataMaxAge = time.Hour
)

func seedBrokersField() *service.ConfigField {
	return service.NewStringListField(kfFieldSeedBrokers).
		Description("Addresses of Kafka brokers to bootstrap from (`host:port`). Each entry may itself be a comma-separated list, so `${KAFKA_BROKERS}` can hold several brokers. The client discovers the rest of the cluster from these.").
		Example([]string{"localhost:9092"}).
		Example([]string{"foo:9092", "bar:9092"}).
		Example([]string{"foo:9092,bar:9092"}).
		LintRule(listLintRule(kfFieldSeedBrokers, "broker address"))
}

func clientIDField() *service.ConfigField {
	return service.NewStringField(kfFieldClientID).
		Description("An identifier for the client connection, visible in broker logs and quotas.").
		Default("forwarder").
		Advanced()
}

func metadataMaxAgeField() *service.ConfigField {
	return service.NewDurationField(kfFieldMetadataAge).
		Description("How old the client's view of the cluster may get before it is refreshed: a partition added to a topic is read (or written) within this. From 5s to 1h. franz-go's and Kafka's default is 5m; ours is shorter because the records of an added partition wait until it is seen, and a refresh is one small request.").
		Default("30s").
		LintRule(metadataMaxAgeLintRule).
		Advanced()
}

func tlsField() *service.ConfigField {
	return service.NewTLSToggledField(kfFieldTLS)
}

func saslField() *service.ConfigField {
	fields := []*service.ConfigField{
		service.NewStringAnnotatedEnumField(kfFieldSASLMech, map[string]string{
			"none":          "No SASL authentication (the entry is ignored).",
			"PLAIN":         "Plain text username and password; use it only over TLS.",
			"SCRAM-SHA-256": "SCRAM with SHA-256.",
			"SCRAM-SHA-512": "SCRAM with SHA-512.",
		}).Description("The SASL mechanism."),
		service.NewStringField(kfFieldSASLUser).
			Description("The username to authenticate as.").
			Default(""),
	}
	fields = append(fields, envsecret.Fields(kfFieldSASLPass, "The password of the user.", "KAFKA_SASL_PASSWORD")...)
	return service.NewObjectListField(kfFieldSASL, fields...).
		Description("SASL authentication mechanisms, tried in order until one succeeds. Leave empty for none.").
		Example([]any{map[string]any{
			"mechanism":    "SCRAM-SHA-512",
			"username":     "forwarder",
			"password_env": "KAFKA_SASL_PASSWORD",
		}}).
		Optional().
		LintRule(saslLintRule).
		Advanced()
}

// parseSeedBrokers reads seed_brokers (parseList).
func parseSeedBrokers(conf *service.ParsedConfig) ([]string, error) {
	return parseList(conf, kfFieldSeedBrokers, "broker address")
}

// parseList reads a string list field whose entries may each hold several
// comma-separated values, as Benthos's kafka components accept; empty values
// are dropped, and at least one what must remain.
func parseList(conf *service.ParsedConfig, field, what string) ([]string, error) {
	raw, err := conf.FieldStringList(field)
	if err != nil {
		return nil, err
	}
	return listValues(field, what, raw)
}

// listValues splits the entries of a list field (parseList), for start-up
// and for lint.
func listValues(field, what string, raw []string) ([]string, error) {
	var values []string
	for _, entry := range raw {
		for _, v := range strings.Split(entry, ",") {
			if v = strings.TrimSpace(v); v != "" {
				values = append(values, v)
			}
		}
	}
	if len(values) == 0 {
		return nil, fmt.Errorf("field %s: at least one %s is required", field, what)
	}
	return values, nil
}

// parseCommonOpts reads the connection fields every kafka_franz component
// has: seed brokers, client id, metadata age, TLS and SASL.
func parseCommonOpts(conf *service.ParsedConfig) ([]kgo.Opt, error) {
	brokers, err := parseSeedBrokers(conf)
	if err != nil {
		return nil, err
	}
	clientID, err := conf.FieldString(kfFieldClientID)
	if err != nil {
		return nil, err
	}
	age, err := conf.FieldDuration(kfFieldMetadataAge)
	if err != nil {
		return nil, err
	}
	if err := checkMetadataMaxAge(age); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID), kgo.MetadataMaxAge(age)}

	tlsConf, tlsOn, err := conf.FieldTLSToggled(kfFieldTLS)
	if err != nil {
		return nil, fmt.Errorf("field %s: %w", kfFieldTLS, err)
	}
	if tlsOn {
		opts = append(opts, kgo.DialTLSConfig(tlsConf))
	}

	mechs, err := parseSASL(conf)
	if err != nil {
		return nil, err
	}
	if len(mechs) > 0 {
		opts = append(opts, kgo.SASL(mechs...))
	}
	return opts, nil
}

// saslMechanisms builds each supported mechanism from a user and password.
var saslMechanisms = map[string]func(user, pass string) sasl.Mechanism{
	"PLAIN":         func(u, p string) sasl.Mechanism { return plain.Auth{User: u, Pass: p}.AsMechanism() },
	"SCRAM-SHA-256": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha256Mechanism() },
	"SCRAM-SHA-512": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha512Mechanism() },
}

func parseSASL(conf *service.ParsedConfig) ([]sasl.Mechanism, error) {
	if !conf.Contains(kfFieldSASL) {
		return nil, nil
	}
	list, err := conf.FieldObjectList(kfFieldSASL)
	if err != nil {
		return nil, err
	}
	var mechs []sasl.Mechanism
	for i, c := range list {
		mech, err := c.FieldString(kfFieldSASLMech)
		if err != nil {
			return nil, err
		}
		if mech == "none" || mech == "" {
			continue
		}
		build, ok := saslMechanisms[mech]
		if !ok {
			return nil, fmt.Errorf("field %s[%d].%s: unsupported mechanism %q (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", kfFieldSASL, i, kfFieldSASLMech, mech)
		}
		user, err := c.FieldString(kfFieldSASLUser)
		if err != nil {
			return nil, err
		}
		pass, source, err := envsecret.Read(c, kfFieldSASLPass)
		if err != nil {
			return nil, err
		}
		if pass == "" {
			return nil, fmt.Errorf("field %s[%d]: %s needs a password: set the environment variable %s (or the field %s)", kfFieldSASL, i, mech, source, kfFieldSASLPass)
		}
		mechs = append(mechs, build(user, pass))
	}
	return mechs, nil
}

// parseByteSize reads a size that must fit in an int32, as Kafka's request
// fields do.
func parseByteSize(conf *service.ParsedConfig, field string) (int32, error) {
	n, err := parseBytes(conf, field, math.MaxInt32, "between 1B and 2147483647B (2GiB less a byte)")
	return int32(n), err
}

// maxBrokerIO is the largest request franz-go writes to a broker and the
// largest response it reads (BrokerMaxWriteBytes, BrokerMaxReadBytes): a
// client configured beyond it is refused when it is created.
const maxBrokerIO = 1 << 30

// parseBrokerIOSize reads a size that franz-go must be able to send or
// receive whole: from 1B to 1GiB.
func parseBrokerIOSize(conf *service.ParsedConfig, field string) (int32, error) {
	n, err := parseBytes(conf, field, maxBrokerIO, "between 1B and 1GiB, the largest request or response franz-go handles")
	return int32(n), err
}

// brokerIOBytes is the BrokerMaxReadBytes or BrokerMaxWriteBytes that
// leaves room for n bytes of records and their framing: twice n, at least
// franz-go's default of 100MiB, at most maxBrokerIO.
func brokerIOBytes(n int32) int32 {
	return int32(min(max(100<<20, 2*int64(n)), maxBrokerIO))
}

// parseBudget reads a size of at least one byte.
func parseBudget(conf *service.ParsedConfig, field string) (int64, error) {
	n, err := parseBytes(conf, field, 1<<62, "between 1B and 4EiB")
	return int64(n), err
}

// parseBytes reads a size such as "64MiB" or "1048576", from 1 byte to max;
// bounds says that range in the error.
func parseBytes(conf *service.ParsedConfig, field string, max uint64, bounds string) (uint64, error) {
	s, err := conf.FieldString(field)
	if err != nil {
		return 0, err
	}
	return byteSize(field, s, max, bounds)
}

// byteSize reads the value s of a size field (parseBytes), for start-up
// and for lint.
func byteSize(field, s string, max uint64, bounds string) (uint64, error) {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("field %s: %q is not a byte size such as 64MiB: %w", field, s, err)
	}
	if n == 0 || n > max {
		return 0, fmt.Errorf("field %s: %q must be %s", field, s, bounds)
	}
	return n, nil
}

// kgoLogger passes franz-go's own logs to Benthos at debug (and trace)
// level: franz-go logs every retry, which is noise at info level, while our
// components log what an operator acts on (assignments, outages) themselves.
// Two franz-go lines call for more than a log line, and go to a function
// too when it is set: records deleted under the consumer (franzOutOfRange,
// to outOfRange) and a topic deleted and created again (franzRecreated, to
// recreated).
type kgoLogger struct {
	log        *service.Logger
	outOfRange func(topic string, partition int32, prior int64)
	recreated  func(topic string)
}

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if l.recreated != nil && strings.HasPrefix(msg, franzRecreated) {
		for i := 0; i+1 < len(keyvals); i += 2 {
			if topic, ok := keyvals[i+1].(string); ok && keyvals[i] == "topic" {
				l.recreated(topic)
			}
		}
	}
	if l.outOfRange != nil && strings.HasPrefix(msg, franzOutOfRange) {
		var (
			topic     string
			partition int32
			prior     int64 = -1
		)
		for i := 0; i+1 < len(keyvals); i += 2 {
			switch v := keyvals[i+1]; keyvals[i] {
			case "topic":
				topic, _ = v.(string)
			case "partition":
				partition, _ = v.(int32)
			case "prior_offset":
				prior, _ = v.(int64)
			}
		}
		if topic != "" && prior >= 0 {
			l.outOfRange(topic, partition, prior)
		}
	}
	var b strings.Builder
	b.WriteString(msg)
	for i := 0; i+1 < len(keyvals); i += 2 {
		fmt.Fprintf(&b, " %v=%v", keyvals[i], keyvals[i+1])
	}
	if level <= kgo.LogLevelWarn {
		l.log.Debug("franz-go: " + b.String())
		return
	}
	l.log.Trace("franz-go: " + b.String())
}

// outageLogger is a franz-go hook that logs a broker that cannot be reached
// once when the outage starts and once when it ends, however many times the
// client retries in between (franz-go retries with backoff on its own).
type outageLogger struct {
	log *service.Logger

	mu   sync.Mutex
	down map[string]time.Time // broker address → start of its outage
}

var _ kgo.HookBrokerConnect = (*outageLogger)(nil)

func newOutageLogger(log *service.Logger) *outageLogger {
	return &outageLogger{log: log, down: make(map[string]time.Time)}
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (o *outageLogger) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port))
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed)) {
		// Our own stop cancelled the dial: says nothing of the broker
		// (franz-go does not count it as a failure either).
		o.log.Debugf("kafka broker %s: dial cancelled: %v", addr, err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	since, wasDown := o.down[addr]
	switch {
	case err != nil && !wasDown:
		o.down[addr] = time.Now()
		o.log.Warnf("kafka broker %s is unreachable, retrying with backoff (logged once per outage): %v", addr, err)
	case err != nil:
		o.log.Debugf("kafka broker %s still unreachable: %v", addr, err)
	case wasDown:
		delete(o.down, addr)
		o.log.Infof("kafka broker %s is reachable again after %s", addr, time.Since(since).Round(time.Millisecond))
	}
}

// anyDown reports whether some broker's outage has been logged and not yet
// ended.
func (o *outageLogger) anyDown() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.down) > 0
}

// reachableClient creates a client with opts and waits until a broker
// answers it (waitReachable); on error the client is closed.
func reachableClient(ctx context.Context, opts []kgo.Opt, log *service.Logger, outage *outageLogger) (*kgo.Client, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("creating kafka client: %w", err)
	}
	if err := waitReachable(ctx, cl, log, outage); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// waitReachable blocks until a broker answers cl or ctx ends, retrying with
// backoff. Dial and authentication failures are logged by the outage hook;
// anything else is logged here, once.
func waitReachable(ctx context.Context, cl *kgo.Client, log *service.Logger, outage *outageLogger) error {
	backoff := 100 * time.Millisecond
	warned := false
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			if warned {
				log.Info("kafka_franz: a broker is reachable")
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !warned && !outage.anyDown() {
			log.Warnf("kafka_franz: waiting for a reachable broker, retrying with backoff: %v", err)
			warned = true
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
