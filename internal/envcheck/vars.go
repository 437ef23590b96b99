// Package envcheck checks the environment variables a pipeline config uses
// before Benthos reads the config, so that a bad value is reported by the
// variable the user set (`FORWARD_TIMEOUT=abc: not a duration above zero, e.g. 10s`)
// rather than by the YAML field it lands in, and before anything connects.
//
// Only variables that the config files reference are checked (`${NAME…}` in
// the file, or read from the environment by one of our plugins), so a
// pipeline of one's own is not judged by the shipped one. The kinds of the
// known variables are in Vars; docs/configuration.md documents them.
// Secret values are never printed.
package envcheck

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dustin/go-humanize"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
)

// Kind is what a variable's value must be.
type Kind int

// The kinds of value.
const (
	// Text is any value.
	Text Kind = iota
	// Duration is Go's syntax (time.ParseDuration), not negative.
	Duration
	// PositiveDuration is Go's syntax, above zero.
	PositiveDuration
	// DurationDays is Go's syntax plus days (outboxdb.ParseDuration).
	DurationDays
	// PositiveInt is a whole number ≥ 1.
	PositiveInt
	// NonNegativeInt is a whole number ≥ 0.
	NonNegativeInt
	// NonNegativeNumber is a decimal number ≥ 0.
	NonNegativeNumber
	// Ratio is a decimal number from 0 to 1.
	Ratio
	// Enum is one of Var.Options, as written.
	Enum
	// LogLevel is one of Benthos's log levels, in any case.
	LogLevel
	// HostPort is host:port with a numeric port (the host may be empty).
	HostPort
	// BrokerList is a comma-separated list of host or host:port.
	BrokerList
	// HTTPURL is an http:// or https:// URL with a host.
	HTTPURL
	// BaseURL is an HTTPURL that a path is appended to as text: it may
	// have a path of its own, but no trailing slash, query or fragment.
	BaseURL
	// KafkaTopic is a legal Kafka topic name: 1 to 249 of a-z, A-Z, 0-9,
	// '.', '_' and '-', not "." or "..".
	KafkaTopic
	// Zone is an IANA time zone name.
	Zone
	// PostgresDSN is a libpq connection string, URL or key=value.
	PostgresDSN
	// ByteSize is a size such as 64MiB or 1048576, or 0, of at most
	// outboxdb.MaxByteBudget.
	ByteSize
	// PartitionWidth is a whole number of hours from 1h to 7d
	// (outboxdb.ParsePartitionWidth).
	PartitionWidth
	// JSONText is any valid UTF-8 text: a value sent inside a JSON string,
	// which cannot carry other bytes unchanged (encoding/json would replace
	// them with U+FFFD, and the platform would refuse the credentials for
	// ever).
	JSONText
)

// Var is a known environment variable.
type Var struct {
	Name string
	Kind Kind
	// Example is a valid value shown in the error message.
	Example string
	// Options are the values of an Enum.
	Options []string
	// Secret values are never printed.
	Secret bool
	// Min is the shortest a PositiveDuration may be, when above zero, and
	// Why says what a shorter one would do.
	Min time.Duration
	// Max is the largest a PositiveInt or NonNegativeInt may be, when
	// above zero.
	Max int
	// Longest is the longest a Duration may be, when above zero, and Why
	// says what a longer one would do.
	Longest time.Duration
	Why     string
}

// kafkaTopic matches the names Kafka accepts for a topic.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// logLevels are the levels Benthos's logger accepts (case-insensitive).
var logLevels = []string{"OFF", "NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"}

// Vars are the variables of the shipped pipelines and of what our plugins
// read from the environment. docs/configuration.md describes each; the docs
// test keeps the two in step.
var Vars = []Var{
	{Name: "KAFKA_BROKERS", Kind: BrokerList, Example: "kafka-1:9092,kafka-2:9092"},
	{Name: "KAFKA_GROUP", Kind: Text},
	{Name: "KAFKA_TOPIC_VEHICLE", Kind: KafkaTopic, Example: "device-vehicle-event"},
	{Name: "KAFKA_TOPIC_HEARTBEAT", Kind: KafkaTopic, Example: "device-heartbeat"},
	{Name: "KAFKA_TOPIC_DEAD_LETTER", Kind: KafkaTopic, Example: "forwarder-dead-letter"},
	{Name: "KAFKA_TLS", Kind: Enum, Options: []string{"false", "true"}},
	{Name: "KAFKA_TLS_CA_FILE", Kind: Text},
	{Name: "KAFKA_SASL_MECHANISM", Kind: Enum, Options: []string{"none", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}},
	{Name: "KAFKA_SASL_USERNAME", Kind: Text},
	{Name: "KAFKA_SASL_PASSWORD", Kind: Text, Secret: true},
	{Name: "KAFKA_BATCH_PERIOD", Kind: Duration, Example: "10ms", Longest: time.Second,
		Why: "every message would wait up to that long before it is stored; the period is meant in milliseconds"},
	{Name: "DATABASE_URL", Kind: PostgresDSN, Secret: true},
	{Name: "DATABASE_DIRECT_URL", Kind: PostgresDSN, Secret: true},
	{Name: "DATABASE_MIGRATE_URL", Kind: PostgresDSN, Secret: true},
	{Name: "CONSOLE_DATABASE_URL", Kind: PostgresDSN, Secret: true},
	{Name: "PLATFORM_URL", Kind: BaseURL, Example: "https://platform.example.com"},
	{Name: "PLATFORM_ACCESS_NAME", Kind: JSONText, Secret: true},
	{Name: "PLATFORM_ACCESS_PWD", Kind: JSONText, Secret: true},
	{Name: "PLATFORM_TLS_CA_FILE", Kind: Text},
	{Name: "PLATFORM_TZ", Kind: Zone, Example: "Asia/Shanghai"},
	{Name: "HTTP_ADDR", Kind: HostPort, Example: "0.0.0.0:4195"},
	{Name: "DEAD_LETTER_HTTP_ADDR", Kind: HostPort, Example: "0.0.0.0:4197"},
	{Name: "FORWARD_MAX_IN_FLIGHT", Kind: PositiveInt, Example: "100", Max: pluginconf.MaxInFlight},
	{Name: "FORWARD_TIMEOUT", Kind: PositiveDuration, Example: "10s", Min: pluginconf.MinTimeout,
		Why: pluginconf.MinTimeoutWhy},
	{Name: "FORWARD_MAX_ATTEMPTS", Kind: PositiveInt, Example: "5", Max: outboxdb.MaxAttemptsLimit},
	{Name: "FORWARD_RETRY_INITIAL", Kind: Duration, Example: "5s"},
	{Name: "FORWARD_RETRY_MAX", Kind: Duration, Example: "300s"},
	{Name: "CLAIM_LEASE", Kind: Duration, Example: "60s"},
	{Name: "OUTBOX_BATCH_SIZE", Kind: PositiveInt, Example: "300"},
	{Name: "OUTBOX_MAX_UNACKED", Kind: PositiveInt, Example: "2400"},
	{Name: "OUTBOX_MAX_UNACKED_DIRECT", Kind: NonNegativeInt, Example: "2400"},
	{Name: "OUTBOX_MAX_UNACKED_BYTES", Kind: ByteSize, Example: "64MiB"},
	{Name: "OUTBOX_PARTITION", Kind: PartitionWidth, Example: "1d"},
	{Name: "OUTBOX_RETENTION", Kind: DurationDays, Example: "7d"},
	{Name: "OUTBOX_RETENTION_FORCE", Kind: Enum, Options: []string{"false", "true"}},
	{Name: "OUTBOX_RETENTION_DEAD_LETTER", Kind: Enum, Options: []string{"false", "true"}},
	{Name: "DEAD_LETTER_POLL_INTERVAL", Kind: PositiveDuration, Example: "5s"},
	{Name: "LOG_LEVEL", Kind: LogLevel, Options: logLevels},
	{Name: "SHUTDOWN_TIMEOUT", Kind: Duration, Example: "30s"},
	{Name: "PLATFORM_PROBE_INTERVAL", Kind: PositiveDuration, Example: "5s", Min: pluginconf.MinProbeInterval,
		Why: pluginconf.MinProbeIntervalWhy},
	{Name: "FORWARD_RATE_LIMIT", Kind: NonNegativeNumber, Example: "50"},
	{Name: "FAILED_REQUEUE_AFTER", Kind: Duration, Example: "1h"},
	{Name: "FAILED_REQUEUE_ROUNDS", Kind: NonNegativeInt, Example: "3", Max: outboxdb.MaxRequeueRounds},
	{Name: "ORDERING", Kind: Enum, Options: []string{"berth", "off"}},
	{Name: "ORDER_ON_FAILED", Kind: Enum, Options: []string{"skip", "block"}},
	{Name: "CONSOLE_ADDR", Kind: HostPort, Example: "127.0.0.1:4196"},
	{Name: "CONSOLE_TOKEN", Kind: Text, Secret: true},
	// Tracing (docs/operations.md, "Tracing"): the OpenTelemetry exporter
	// reads the endpoint itself; the pipeline reads the ratio.
	{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Kind: HTTPURL, Example: "http://otel-collector:4318"},
	{Name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Kind: HTTPURL, Example: "http://otel-collector:4318/v1/traces"},
	// May carry a collector's credentials (authorization=Bearer …).
	{Name: "OTEL_EXPORTER_OTLP_HEADERS", Kind: Text, Secret: true},
	// Milliseconds, as the OpenTelemetry specification has it. The exporter
	// multiplies them into a Duration: beyond its range the product wraps
	// (to -1ms for the largest int) and every export times out at once.
	{Name: "OTEL_EXPORTER_OTLP_TIMEOUT", Kind: PositiveInt, Example: "10000", Max: int(math.MaxInt64 / int64(time.Millisecond))},
	{Name: "OTEL_EXPORTER_OTLP_CERTIFICATE", Kind: Text},
	{Name: "TRACE_SAMPLE_RATIO", Kind: Ratio, Example: "0.1"},
}

// Lookup returns the known variable called name.
func Lookup(name string) (Var, bool) {
	i := slices.IndexFunc(Vars, func(v Var) bool { return v.Name == name })
	if i < 0 {
		return Var{}, false
	}
	return Vars[i], true
}

// Check returns nil when value is acceptable for v, else an error that names
// the variable and says what it expects. It shows the value unless v is
// secret.
func (v Var) Check(value string) error {
	why := v.problem(value)
	if why == "" {
		return nil
	}
	if v.Secret {
		return fmt.Errorf("%s: %s; the value is not shown, it is a secret", v.Name, why)
	}
	return fmt.Errorf("%s=%s: %s", v.Name, show(value), why)
}

// problem says what is wrong with value, "" when nothing is.
func (v Var) problem(value string) string {
	eg := ""
	if v.Example != "" {
		eg = ", e.g. " + v.Example
	}
	switch v.Kind {
	case Duration:
		d, err := time.ParseDuration(value)
		if err != nil || d < 0 {
			return "not a duration" + eg
		}
		if v.Longest > 0 && d > v.Longest {
			return fmt.Sprintf("longer than %v: %s%s", v.Longest, v.Why, eg)
		}
	case PositiveDuration:
		d, err := time.ParseDuration(value)
		if err != nil || d <= 0 {
			return "not a duration above zero" + eg
		}
		if d < v.Min {
			return fmt.Sprintf("shorter than %v: %s%s", v.Min, v.Why, eg)
		}
	case DurationDays:
		if _, err := outboxdb.ParseDuration(value); err != nil {
			// A number with a unit: why it is not one (too long, the unit).
			if why := errors.Unwrap(err); why != nil && outboxdb.MeantAsDuration(value) {
				return why.Error() + eg
			}
			return "not a duration (Go's syntax plus days: 7d, 36h, 1d12h)" + eg
		}
	case PositiveInt, NonNegativeInt:
		least := 0
		if v.Kind == PositiveInt {
			least = 1
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < least {
			return fmt.Sprintf("not a whole number of at least %d%s", least, eg)
		}
		if v.Max > 0 && n > v.Max {
			return fmt.Sprintf("more than %d%s", v.Max, eg)
		}
	case NonNegativeNumber:
		if f, err := strconv.ParseFloat(value, 64); err != nil || !(f >= 0 && f <= math.MaxFloat64) {
			return "not a number of at least 0" + eg
		}
	case Ratio:
		if f, err := strconv.ParseFloat(value, 64); err != nil || !(f >= 0 && f <= 1) {
			return "not a number from 0 to 1" + eg
		}
	case Enum:
		if !slices.Contains(v.Options, value) {
			return "not one of " + strings.Join(v.Options, ", ")
		}
	case LogLevel:
		if !slices.Contains(v.Options, strings.ToUpper(value)) {
			return "not a log level: one of " + strings.Join(v.Options, ", ")
		}
	case HostPort:
		if err := checkHostPort(value); err != nil {
			return "not host:port (" + err.Error() + ")" + eg
		}
	case BrokerList:
		for b := range strings.SplitSeq(value, ",") {
			b = strings.TrimSpace(b)
			if b == "" {
				return "an empty broker address in the list" + eg
			}
			if strings.Contains(b, ":") {
				if err := checkHostPort(b); err != nil {
					return fmt.Sprintf("broker %s is not host:port (%v)", show(b), err) + eg
				}
				// Port 0 is for listening (any free port); nothing is
				// ever reached at it.
				_, port, _ := net.SplitHostPort(b)
				if n, _ := strconv.Atoi(port); n == 0 {
					return fmt.Sprintf("broker %s has port 0, which no broker listens on", show(b)) + eg
				}
			}
		}
	case HTTPURL, BaseURL:
		u, err := url.Parse(value)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "not an http:// or https:// URL with a host" + eg
		}
		// The pipeline appends the endpoint's path (/mch/business): a
		// trailing slash would make it //mch/business, which a platform
		// may redirect (never followed) or not know, and it would land
		// inside a query or a fragment.
		if v.Kind == BaseURL && (strings.HasSuffix(value, "/") || strings.ContainsAny(value, "?#")) {
			return "a base URL the endpoint's path is appended to: leave out the trailing /, query and fragment" + eg
		}
	case KafkaTopic:
		// A comma would split it into two topics (the input takes
		// comma-separated lists) while the outbox maps it whole to an API
		// type; other characters Kafka refuses.
		if !kafkaTopic.MatchString(value) || value == "." || value == ".." {
			return "not a Kafka topic name: 1 to 249 of a-z A-Z 0-9 . _ -" + eg
		}
	case Zone:
		if _, err := time.LoadLocation(value); err != nil {
			return "not a time zone name" + eg
		}
	case ByteSize:
		if n, err := humanize.ParseBytes(value); err != nil || n > outboxdb.MaxByteBudget {
			return "not a byte size of at most 4EiB" + eg
		}
	case PartitionWidth:
		if d, err := outboxdb.ParseDuration(value); err != nil || outboxdb.CheckPartitionWidth(d) != nil {
			return "not a partition width: a whole number of hours from 1h to 7d" + eg
		}
	case JSONText:
		if !utf8.ValidString(value) {
			return "not valid UTF-8 text: it is sent inside a JSON request body, which holds only UTF-8, so these bytes would arrive altered"
		}
	case PostgresDSN:
		// pgconn's error quotes the string, password and all: only say
		// which form was expected.
		cfg, err := pgconn.ParseConfig(value)
		if err != nil {
			return "not a PostgreSQL connection string: a URL such as postgres://user:password@host:5432/forwarder " +
				"(percent-encode @ : / ? # % in the password) or key=value pairs such as host=db dbname=forwarder"
		}
		// An @ left raw in a URL's password splits it at the first @: the
		// rest of the password becomes the host, and every connection
		// error would print it.
		if hostHasAt(cfg) {
			return "the host holds an @: a password with @ in a URL must be percent-encoded (@ as %40), " +
				"e.g. postgres://user:p%40ss@host:5432/forwarder"
		}
	}
	return ""
}

// hostHasAt reports whether a host of cfg (fallbacks included) holds an @.
func hostHasAt(cfg *pgconn.Config) bool {
	if strings.Contains(cfg.Host, "@") {
		return true
	}
	for _, f := range cfg.Fallbacks {
		if strings.Contains(f.Host, "@") {
			return true
		}
	}
	return false
}

func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		var aerr *net.AddrError
		if errors.As(err, &aerr) {
			return errors.New(aerr.Err)
		}
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("the port is not a number from 0 to 65535")
	}
	return nil
}

// show is a non-secret value as it can be read in a message: quoted when it
// has spaces or unprintable characters, cut when long.
func show(v string) string {
	const max = 80
	if len(v) > max {
		v = v[:max] + "…"
	}
	if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == '"' || r == 0x7f }) || !strconv.CanBackquote(v) {
		return strconv.Quote(v)
	}
	return v
}
