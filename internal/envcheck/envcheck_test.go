package envcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestVarCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, value string
		want        string // "" when the value is accepted
	}{
		{"FORWARD_TIMEOUT", "10s", ""},
		{"FORWARD_TIMEOUT", "abc", "FORWARD_TIMEOUT=abc: not a duration above zero, e.g. 10s"},
		{"FORWARD_RETRY_MAX", "abc", "FORWARD_RETRY_MAX=abc: not a duration, e.g. 300s"},
		{"FORWARD_TIMEOUT", "-1s", "FORWARD_TIMEOUT=-1s: not a duration"},
		// A request needs time, probes and polls an interval: zero is refused
		// by lint as http_forwarder and the dead-letter input refuse it at
		// start-up; a backoff or a batching period may be zero.
		{"FORWARD_TIMEOUT", "0s", "FORWARD_TIMEOUT=0s: not a duration above zero, e.g. 10s"},
		// The shortest a request may be given, and what is refused below it.
		{"FORWARD_TIMEOUT", "1ms", ""},
		{"FORWARD_TIMEOUT", "999us", "FORWARD_TIMEOUT=999us: shorter than 1ms: too short for a request to the platform, e.g. 10s"},
		{"FORWARD_TIMEOUT", "1ns", "FORWARD_TIMEOUT=1ns: shorter than 1ms"},
		{"PLATFORM_PROBE_INTERVAL", "0s", "PLATFORM_PROBE_INTERVAL=0s: not a duration above zero, e.g. 5s"},
		{"PLATFORM_PROBE_INTERVAL", "1ms", ""},
		{"PLATFORM_PROBE_INTERVAL", "999us", "PLATFORM_PROBE_INTERVAL=999us: shorter than 1ms: the instances space their probes in whole milliseconds, so every instance would probe as fast as it can, e.g. 5s"},
		{"DEAD_LETTER_POLL_INTERVAL", "0", "DEAD_LETTER_POLL_INTERVAL=0: not a duration above zero"},
		{"FORWARD_RETRY_INITIAL", "0s", ""},
		{"KAFKA_BATCH_PERIOD", "0s", ""},
		// The longest batching period, and a typo of 10ms refused.
		{"KAFKA_BATCH_PERIOD", "1s", ""},
		{"KAFKA_BATCH_PERIOD", "1001ms", "KAFKA_BATCH_PERIOD=1001ms: longer than 1s: every message would wait up to that long before it is stored; the period is meant in milliseconds, e.g. 10ms"},
		{"KAFKA_BATCH_PERIOD", "10m", "KAFKA_BATCH_PERIOD=10m: longer than 1s"},
		{"OUTBOX_RETENTION", "7d", ""},
		{"OUTBOX_RETENTION", "1d12h", ""},
		{"OUTBOX_RETENTION", "7 days", `OUTBOX_RETENTION="7 days": unknown unit " days" (want ns, us, ms, s, m, h or d), e.g. 7d`},
		{"OUTBOX_RETENTION", "a week", `OUTBOX_RETENTION="a week": not a duration (Go's syntax plus days: 7d, 36h, 1d12h), e.g. 7d`},
		{"OUTBOX_RETENTION", "106752d", "OUTBOX_RETENTION=106752d: too long (the limit is about 106751d), e.g. 7d"},
		{"OUTBOX_RETENTION", "7x", `OUTBOX_RETENTION=7x: unknown unit "x" (want ns, us, ms, s, m, h or d), e.g. 7d`},
		// The narrowest and widest partitions, and what is refused around them.
		{"OUTBOX_PARTITION", "1h", ""},
		{"OUTBOX_PARTITION", "6h", ""},
		{"OUTBOX_PARTITION", "1d", ""},
		{"OUTBOX_PARTITION", "7d", ""},
		{"OUTBOX_PARTITION", "59m", "OUTBOX_PARTITION=59m: not a partition width: a whole number of hours from 1h to 7d, e.g. 1d"},
		{"OUTBOX_PARTITION", "90m", "OUTBOX_PARTITION=90m: not a partition width"},
		{"OUTBOX_PARTITION", "7d1h", "OUTBOX_PARTITION=7d1h: not a partition width"},
		{"OUTBOX_PARTITION", "1 day", `OUTBOX_PARTITION="1 day": not a partition width`},
		{"OUTBOX_RETENTION_DEAD_LETTER", "yes", "OUTBOX_RETENTION_DEAD_LETTER=yes: not one of false, true"},
		{"FORWARD_MAX_IN_FLIGHT", "100", ""},
		{"FORWARD_MAX_IN_FLIGHT", "0", "FORWARD_MAX_IN_FLIGHT=0: not a whole number of at least 1, e.g. 100"},
		{"FORWARD_MAX_IN_FLIGHT", "10000", ""},
		{"FORWARD_MAX_IN_FLIGHT", "10001", "FORWARD_MAX_IN_FLIGHT=10001: more than 10000, e.g. 100"},
		{"FORWARD_MAX_IN_FLIGHT", "1.5", "not a whole number"},
		// The longest export timeout a Duration holds, in milliseconds.
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "9223372036854", ""},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "9223372036855", "OTEL_EXPORTER_OTLP_TIMEOUT=9223372036855: more than 9223372036854, e.g. 10000"},
		// A row's attempts and rounds are counted in integer columns.
		{"FORWARD_MAX_ATTEMPTS", "2147483647", ""},
		{"FORWARD_MAX_ATTEMPTS", "9223372036854775807", "FORWARD_MAX_ATTEMPTS=9223372036854775807: more than 2147483647, e.g. 5"},
		{"FAILED_REQUEUE_ROUNDS", "0", ""},
		{"FAILED_REQUEUE_ROUNDS", "2147483647", ""},
		{"FAILED_REQUEUE_ROUNDS", "2147483648", "FAILED_REQUEUE_ROUNDS=2147483648: more than 2147483647, e.g. 3"},
		// The largest byte budget the dispatcher takes, and beyond it (16EiB
		// does not fit in 64 bits at all).
		{"OUTBOX_MAX_UNACKED_BYTES", "0", ""},
		{"OUTBOX_MAX_UNACKED_BYTES", "4EiB", ""},
		{"OUTBOX_MAX_UNACKED_BYTES", "5EiB", "OUTBOX_MAX_UNACKED_BYTES=5EiB: not a byte size of at most 4EiB, e.g. 64MiB"},
		{"OUTBOX_MAX_UNACKED_BYTES", "15EiB", "not a byte size of at most 4EiB"},
		{"OUTBOX_MAX_UNACKED_BYTES", "16EiB", "not a byte size of at most 4EiB"},
		{"FAILED_REQUEUE_ROUNDS", "-1", "FAILED_REQUEUE_ROUNDS=-1: not a whole number of at least 0"},
		{"FORWARD_RATE_LIMIT", "0", ""},
		{"FORWARD_RATE_LIMIT", "12.5", ""},
		{"FORWARD_RATE_LIMIT", "-3", "FORWARD_RATE_LIMIT=-3: not a number of at least 0"},
		{"FORWARD_RATE_LIMIT", "NaN", "not a number of at least 0"},
		{"FORWARD_RATE_LIMIT", "Inf", "not a number of at least 0"},
		// The smallest and largest limits: one request in a lifetime, and
		// no limit that could bind.
		{"FORWARD_RATE_LIMIT", "1e-12", ""},
		{"FORWARD_RATE_LIMIT", "1e300", ""},
		{"TRACE_SAMPLE_RATIO", "0", ""},
		{"TRACE_SAMPLE_RATIO", "1", ""},
		{"TRACE_SAMPLE_RATIO", "0.25", ""},
		{"TRACE_SAMPLE_RATIO", "1.5", "TRACE_SAMPLE_RATIO=1.5: not a number from 0 to 1"},
		{"TRACE_SAMPLE_RATIO", "NaN", "not a number from 0 to 1"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318", ""},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector:4318", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"ORDERING", "berth", ""},
		{"ORDERING", "Berth", "ORDERING=Berth: not one of berth, off"},
		{"ORDER_ON_FAILED", "wait", "ORDER_ON_FAILED=wait: not one of skip, block"},
		{"LOG_LEVEL", "debug", ""},
		{"LOG_LEVEL", "verbose", "LOG_LEVEL=verbose: not a log level: one of OFF"},
		{"HTTP_ADDR", ":4195", ""},
		{"HTTP_ADDR", "[::1]:4195", ""},
		{"HTTP_ADDR", "bogus", "HTTP_ADDR=bogus: not host:port (missing port in address), e.g. 0.0.0.0:4195"},
		{"HTTP_ADDR", "host:http", "HTTP_ADDR=host:http: not host:port (the port is not a number"},
		{"CONSOLE_ADDR", "0.0.0.0:99999", "CONSOLE_ADDR=0.0.0.0:99999: not host:port"},
		{"KAFKA_BROKERS", "a:9092, b:9092,c", ""},
		{"KAFKA_BROKERS", "a:9092,,b", "KAFKA_BROKERS=a:9092,,b: an empty broker address"},
		{"KAFKA_BROKERS", "a:x", "KAFKA_BROKERS=a:x: broker a:x is not host:port"},
		{"KAFKA_BROKERS", "a:9092,b:0", "KAFKA_BROKERS=a:9092,b:0: broker b:0 has port 0, which no broker listens on"},
		{"KAFKA_BROKERS", "a:10", ""},
		{"KAFKA_BROKERS", "a:00", "broker a:00 has port 0"},
		{"PLATFORM_URL", "https://p.example.com/base", ""},
		{"PLATFORM_URL", "p.example.com", "PLATFORM_URL=p.example.com: not an http:// or https:// URL"},
		{"KAFKA_TOPIC_VEHICLE", "device-vehicle-event", ""},
		{"KAFKA_TOPIC_HEARTBEAT", "A.b_c-9", ""},
		{"KAFKA_TOPIC_VEHICLE", "a,b", "KAFKA_TOPIC_VEHICLE=a,b: not a Kafka topic name: 1 to 249 of a-z A-Z 0-9 . _ -, e.g. device-vehicle-event"},
		{"KAFKA_TOPIC_DEAD_LETTER", "dead letter", "not a Kafka topic name"},
		{"KAFKA_TOPIC_HEARTBEAT", "..", "not a Kafka topic name"},
		{"KAFKA_TOPIC_HEARTBEAT", strings.Repeat("t", 249), ""},
		{"KAFKA_TOPIC_HEARTBEAT", strings.Repeat("t", 250), "not a Kafka topic name"},
		{"PLATFORM_URL", "https://p.example.com", ""},
		{"PLATFORM_URL", "https://p.example.com/", "PLATFORM_URL=https://p.example.com/: a base URL the endpoint's path is appended to: leave out the trailing /, query and fragment, e.g. https://platform.example.com"},
		{"PLATFORM_URL", "https://p.example.com/base/", "leave out the trailing /"},
		{"PLATFORM_URL", "https://p.example.com/base?tenant=a", "leave out the trailing /, query and fragment"},
		// Other URLs are used whole: a trailing slash is theirs to have.
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318/", ""},
		{"PLATFORM_TZ", "Europe/Paris", ""},
		{"PLATFORM_TZ", "Nowhere/City", "PLATFORM_TZ=Nowhere/City: not a time zone name, e.g. Asia/Shanghai"},
		{"DATABASE_URL", "postgres://u:p@db:5432/x?sslmode=verify-full", ""},
		{"DATABASE_URL", "host=db dbname=x sslmode=verify-full", ""},
		{"DATABASE_URL", "postgres://u:Hunter2@db:port/x", "DATABASE_URL: not a PostgreSQL connection string"},
		// The raw @ would make "ss@db" the host, and errors name the host.
		{"DATABASE_URL", "postgres://u:p@ss@db/x", "DATABASE_URL: the host holds an @: a password with @ in a URL must be percent-encoded"},
		{"DATABASE_URL", "postgres://u:p%40ss@db/x", ""},
		{"PLATFORM_ACCESS_PWD", "anything at all", ""},
	} {
		v, ok := Lookup(tc.name)
		if !ok {
			t.Fatalf("%s is not a known variable", tc.name)
		}
		err := v.Check(tc.value)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s=%q refused: %v", tc.name, tc.value, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s=%q: got %v, want %q", tc.name, tc.value, err, tc.want)
		}
		if err != nil && v.Secret && strings.Contains(err.Error(), tc.value) {
			t.Errorf("%s: the message shows the secret value: %v", tc.name, err)
		}
	}
}

func write(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func names(r Refs) []string {
	var out []string
	for n := range r {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func TestScan(t *testing.T) {
	t.Parallel()

	t.Run("InterpolationsAndDefaults", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := write(t, dir, "a.yaml", `
http:
  address: ${HTTP_ADDR:0.0.0.0:4195}
logger:
  level: $${LOG_LEVEL}   # escaped: a literal, not a variable
output:
  drop: {}
  label: ${MY_OWN}
`)
		refs := Scan(p)
		if got, want := names(refs), []string{"HTTP_ADDR", "MY_OWN"}; !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		if refs["HTTP_ADDR"].Default != "0.0.0.0:4195" || refs["HTTP_ADDR"].Var.Kind != HostPort {
			t.Errorf("HTTP_ADDR: %+v", refs["HTTP_ADDR"])
		}
		if refs["MY_OWN"].Var.Kind != Text {
			t.Errorf("an unknown variable is not plain text: %+v", refs["MY_OWN"])
		}
	})

	t.Run("VariablesThePluginsRead", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// No dsn fields: the plugins read DATABASE_URL (or the variable
		// named by dsn_env); no credential fields: PLATFORM_ACCESS_*.
		p := write(t, dir, "a.yaml", `
input:
  outbox_retry: {}
pipeline:
  processors:
    - outbox:
        dsn_env: INGEST_DB
        direct_dsn_env: INGEST_DIRECT_DB
output:
  http_forwarder:
    url: http://x
    access_pwd_env: MY_PWD
`)
		refs := Scan(p)
		if got, want := names(refs), []string{"DATABASE_DIRECT_URL", "DATABASE_URL", "INGEST_DB", "INGEST_DIRECT_DB", "MY_PWD", "PLATFORM_ACCESS_NAME"}; !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		for _, n := range []string{"INGEST_DB", "INGEST_DIRECT_DB", "DATABASE_DIRECT_URL"} {
			if v := refs[n].Var; v.Kind != PostgresDSN || !v.Secret {
				t.Errorf("%s is not checked as a secret DSN: %+v", n, v)
			}
		}
		for _, n := range []string{"MY_PWD", "PLATFORM_ACCESS_NAME"} {
			if r := refs[n]; !r.Required || !r.Var.Secret {
				t.Errorf("%s: not a required secret: %+v", n, r)
			}
		}
	})

	t.Run("CredentialsWithADefaultAreNotRequired", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := write(t, dir, "a.yaml", `
output:
  http_forwarder:
    dsn: ${DATABASE_URL}
    access_name: ${PLATFORM_ACCESS_NAME:}
    access_pwd: ${PLATFORM_ACCESS_PWD:dev-only}
`)
		refs := Scan(p)
		if !refs["PLATFORM_ACCESS_NAME"].Required || refs["PLATFORM_ACCESS_PWD"].Required {
			t.Errorf("required: name %v (want true), pwd %v (want false)", refs["PLATFORM_ACCESS_NAME"].Required, refs["PLATFORM_ACCESS_PWD"].Required)
		}
	})

	t.Run("PlatformTZThroughAnImportedMapping", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		write(t, dir, "m/common.blobl", "map t {\n  root = this.ts_format_platform(\"2006\")\n}\n")
		write(t, dir, "m/main.blobl", "import \"./common.blobl\"\nroot = this.apply(\"t\")\n")
		write(t, dir, "m/plain.blobl", "root = this\n")
		uses := write(t, dir, "uses.yaml", "pipeline:\n  processors:\n    - mapping_file:\n        path: "+filepath.Join(dir, "m/main.blobl")+"\n")
		plain := write(t, dir, "plain.yaml", "pipeline:\n  processors:\n    - mapping_file:\n        path: "+filepath.Join(dir, "m/plain.blobl")+"\n")
		if _, ok := Scan(uses)["PLATFORM_TZ"]; !ok {
			t.Error("a mapping that imports a ts_format_platform call does not make the config use PLATFORM_TZ")
		}
		if _, ok := Scan(plain)["PLATFORM_TZ"]; ok {
			t.Error("a mapping without ts_format_platform makes the config use PLATFORM_TZ")
		}
	})
}

// TestCheckTracerVariables: a config with the otlp tracer has the
// exporter's variables checked, though it never names them; one without it
// does not.
func TestCheckTracerVariables(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	traced := Scan(write(t, dir, "traced.yaml", "tracer:\n  otlp:\n    sampling_ratio: 1\n"))
	plain := Scan(write(t, dir, "plain.yaml", "output:\n  drop: {}\n"))
	env := func(name string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}[name]
	}
	err := Check(traced, Lint, env).Err()
	for _, want := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT=otel-collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT=10s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("traced config: %v, want %s refused", err, want)
		}
	}
	if err := Check(plain, Lint, env).Err(); err != nil {
		t.Errorf("a config without the tracer checked the exporter's variables: %v", err)
	}
}

// env is a getenv of the NAME=value pairs kv.
func env(kv ...string) func(string) string {
	return func(name string) string {
		for _, e := range kv {
			if n, v, ok := strings.Cut(e, "="); ok && n == name {
				return v
			}
		}
		return ""
	}
}

// TestTopicsProblem: one topic for two purposes is refused, whether the
// values come from the environment or the files' defaults, and whether the
// dead-letter topic is in the same file or another linted with it.
func TestTopicsProblem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	forwarder := write(t, dir, "forwarder.yaml", `
input:
  kafka_franz:
    topics: [ "${KAFKA_TOPIC_VEHICLE:vehicle}", "${KAFKA_TOPIC_HEARTBEAT:heartbeat}" ]
`)
	deadLetter := write(t, dir, "dead_letter.yaml", `
output:
  kafka_franz:
    topic: ${KAFKA_TOPIC_DEAD_LETTER:dead}
`)
	both := Scan(forwarder, deadLetter)
	for _, c := range []struct {
		refs Refs
		env  []string
		want string // "" when accepted
	}{
		{both, nil, ""},
		{both, []string{"KAFKA_TOPIC_VEHICLE=events", "KAFKA_TOPIC_HEARTBEAT=beats"}, ""},
		{both, []string{"KAFKA_TOPIC_VEHICLE=events", "KAFKA_TOPIC_HEARTBEAT=events"},
			`KAFKA_TOPIC_VEHICLE and KAFKA_TOPIC_HEARTBEAT are both "events": the outbox stores each topic's messages as one API type, so one kind would be sent as the other; give each its own topic`},
		// Against the other file's default.
		{both, []string{"KAFKA_TOPIC_HEARTBEAT=vehicle"}, `KAFKA_TOPIC_VEHICLE and KAFKA_TOPIC_HEARTBEAT are both "vehicle"`},
		{both, []string{"KAFKA_TOPIC_DEAD_LETTER=heartbeat"},
			`KAFKA_TOPIC_HEARTBEAT and KAFKA_TOPIC_DEAD_LETTER are both "heartbeat": FAILED rows published to the dead-letter topic would be consumed again as new messages`},
		// A file linted alone is not judged by a variable it does not use.
		{Scan(deadLetter), []string{"KAFKA_TOPIC_DEAD_LETTER=vehicle"}, ""},
	} {
		err := Check(c.refs, Lint, env(c.env...)).Err()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: error %v, want %q", c.env, err, c.want)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := write(t, dir, "a.yaml", `
output:
  http_forwarder:
    timeout: ${FORWARD_TIMEOUT:10s}
    max_in_flight: ${FORWARD_MAX_IN_FLIGHT:100}
    retry:
      initial: ${FORWARD_RETRY_INITIAL:5s}
      max: ${FORWARD_RETRY_MAX:300s}
    lease: ${CLAIM_LEASE:60s}
    access_name: ${PLATFORM_ACCESS_NAME:}
    access_pwd: ${PLATFORM_ACCESS_PWD:}
input:
  outbox_retry:
    max_unacked: ${OUTBOX_MAX_UNACKED:600}
    retention:
      older_than: ${OUTBOX_RETENTION:}
      force: ${OUTBOX_RETENTION_FORCE:false}
`)
	refs := Scan(p)

	res := Check(refs, Lint, env())
	if res.Err() != nil {
		t.Errorf("lint with nothing set: %v", res.Err())
	}
	res = Check(refs, Run, env())
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "PLATFORM_ACCESS_NAME is not set") || !strings.Contains(err.Error(), "PLATFORM_ACCESS_PWD is not set") {
		t.Errorf("run without credentials: %v", err)
	}
	res = Check(refs, Run, env("PLATFORM_ACCESS_NAME=n", "PLATFORM_ACCESS_PWD=p", "FORWARD_TIMEOUT=abc"))
	if err := res.Err(); err == nil || err.Error() != "FORWARD_TIMEOUT=abc: not a duration above zero, e.g. 10s ("+p+")" {
		t.Errorf("run with FORWARD_TIMEOUT=abc: %v", err)
	}

	// The lease check takes the file's defaults for what is not set (10s).
	res = Check(refs, Lint, env("CLAIM_LEASE=10s"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "CLAIM_LEASE=10s must exceed FORWARD_TIMEOUT=10s: set CLAIM_LEASE to at least 11s") {
		t.Errorf("a lease equal to the timeout: %v", err)
	}
	if res = Check(refs, Lint, env("CLAIM_LEASE=3s", "FORWARD_TIMEOUT=2s")); res.Err() != nil {
		t.Errorf("a lease a second above the timeout: %v", res.Err())
	}
	// The longest timeout a Duration holds leaves no lease to advise.
	res = Check(refs, Lint, env("FORWARD_TIMEOUT=2562047h47m16s"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "CLAIM_LEASE=60s must exceed FORWARD_TIMEOUT=2562047h47m16s, and no duration does by a second: lower FORWARD_TIMEOUT") {
		t.Errorf("the longest timeout: %v", err)
	}
	// Above a short timeout, the lease still has outbox_retry's minimum.
	res = Check(refs, Lint, env("CLAIM_LEASE=500ms", "FORWARD_TIMEOUT=100ms"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "CLAIM_LEASE=500ms is below 1s, the shortest lease outbox_retry takes") {
		t.Errorf("a lease below a second: %v", err)
	}
	if res = Check(refs, Lint, env("CLAIM_LEASE=1s", "FORWARD_TIMEOUT=100ms")); res.Err() != nil {
		t.Errorf("a one-second lease above the timeout: %v", res.Err())
	}

	// The backoff's cap may not be below its first delay, with the file's
	// defaults for what is not set (5s, 300s).
	for _, ok := range [][]string{{"FORWARD_RETRY_MAX=5s"}, {"FORWARD_RETRY_INITIAL=0s", "FORWARD_RETRY_MAX=0s"}, {"FORWARD_RETRY_INITIAL=300s"}} {
		if res = Check(refs, Lint, env(ok...)); res.Err() != nil {
			t.Errorf("%v: %v", ok, res.Err())
		}
	}
	res = Check(refs, Lint, env("FORWARD_RETRY_MAX=0s"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "FORWARD_RETRY_MAX=0s must not be less than FORWARD_RETRY_INITIAL=5s: set FORWARD_RETRY_MAX to at least 5s") {
		t.Errorf("FORWARD_RETRY_MAX below the file's FORWARD_RETRY_INITIAL: %v", err)
	}
	res = Check(refs, Lint, env("FORWARD_RETRY_INITIAL=10m"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "FORWARD_RETRY_MAX=300s must not be less than FORWARD_RETRY_INITIAL=10m") {
		t.Errorf("FORWARD_RETRY_INITIAL above the file's FORWARD_RETRY_MAX: %v", err)
	}

	// A retention below a day deletes the keys that make redeliveries
	// harmless: refused unless forced, naming both variables.
	for _, ok := range [][]string{{"OUTBOX_RETENTION=1d"}, {"OUTBOX_RETENTION=7d"}, {"OUTBOX_RETENTION=7m", "OUTBOX_RETENTION_FORCE=true"}} {
		if res = Check(refs, Lint, env(ok...)); res.Err() != nil {
			t.Errorf("%v: %v", ok, res.Err())
		}
	}
	for _, bad := range [][]string{{"OUTBOX_RETENTION=7m"}, {"OUTBOX_RETENTION=0s"}, {"OUTBOX_RETENTION=23h", "OUTBOX_RETENTION_FORCE=false"}} {
		res = Check(refs, Lint, env(bad...))
		want := bad[0] + " is below the safe minimum of 1d"
		if err := res.Err(); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "or OUTBOX_RETENTION_FORCE=true to accept it") {
			t.Errorf("%v: %v, want an error saying %q and how to accept it", bad, err, want)
		}
	}
	res = Check(refs, Lint, env("OUTBOX_RETENTION_FORCE=yes"))
	if err := res.Err(); err == nil || !strings.Contains(err.Error(), "OUTBOX_RETENTION_FORCE=yes: not one of false, true") {
		t.Errorf("OUTBOX_RETENTION_FORCE=yes: %v", err)
	}
}
