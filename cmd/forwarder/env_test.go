package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forwarderEnv is the process environment without the variables the
// pipelines use, plus env: what a user with only env set would run.
func forwarderEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "KAFKA_"), strings.HasPrefix(name, "PLATFORM_"), strings.HasPrefix(name, "FORWARD_"),
			strings.HasPrefix(name, "OUTBOX_"), name == "DATABASE_URL", name == "HTTP_ADDR", name == "CLAIM_LEASE",
			name == "LOG_LEVEL", name == "SHUTDOWN_TIMEOUT":
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

// runAtRoot runs the binary in the repository root with exactly env added
// to a clean environment.
func runAtRoot(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(forwarderBin, args...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = forwarderEnv(env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// credentials let `run` get past its credential check.
var credentials = []string{"PLATFORM_ACCESS_NAME=name", "PLATFORM_ACCESS_PWD=Pwd-0f-the-platform"}

func TestEnvironmentErrors(t *testing.T) {
	t.Parallel()
	run := []string{"-c", "pipelines/forwarder.yaml"}
	lint := []string{"lint", "./pipelines/..."}

	for _, tc := range []struct {
		name string
		env  []string
		want string
		// secret must not appear in the output.
		secret string
	}{
		{name: "Duration", env: []string{"FORWARD_RETRY_INITIAL=abc"}, want: "FORWARD_RETRY_INITIAL=abc: not a duration, e.g. 5s"},
		{name: "ZeroTimeout", env: []string{"FORWARD_TIMEOUT=0s"}, want: "FORWARD_TIMEOUT=0s: not a duration above zero, e.g. 10s"},
		{name: "ZeroProbeInterval", env: []string{"PLATFORM_PROBE_INTERVAL=0s"}, want: "PLATFORM_PROBE_INTERVAL=0s: not a duration above zero"},
		{name: "RetryCapBelowFirstDelay", env: []string{"FORWARD_RETRY_MAX=1s"}, want: "FORWARD_RETRY_MAX=1s must not be less than FORWARD_RETRY_INITIAL=5s"},
		{name: "PositiveInt", env: []string{"FORWARD_MAX_IN_FLIGHT=abc"}, want: "FORWARD_MAX_IN_FLIGHT=abc: not a whole number of at least 1, e.g. 100"},
		{name: "Zero", env: []string{"OUTBOX_BATCH_SIZE=0"}, want: "OUTBOX_BATCH_SIZE=0: not a whole number of at least 1"},
		{name: "Zone", env: []string{"PLATFORM_TZ=Nowhere/City"}, want: "PLATFORM_TZ=Nowhere/City: not a time zone name, e.g. Asia/Shanghai"},
		{name: "HostPort", env: []string{"HTTP_ADDR=bogus"}, want: "HTTP_ADDR=bogus: not host:port"},
		{name: "URL", env: []string{"PLATFORM_URL=platform.example.com"}, want: "PLATFORM_URL=platform.example.com: not an http:// or https:// URL"},
		{name: "LogLevel", env: []string{"LOG_LEVEL=loud"}, want: "LOG_LEVEL=loud: not a log level"},
		{name: "RetentionDays", env: []string{"OUTBOX_RETENTION=a week"}, want: `OUTBOX_RETENTION="a week": not a duration (Go's syntax plus days`},
		{name: "RetentionBelowADay", env: []string{"OUTBOX_RETENTION=7m"}, want: "OUTBOX_RETENTION=7m is below the safe minimum of 1d"},
		{name: "PartitionTooNarrow", env: []string{"OUTBOX_PARTITION=30m"}, want: "OUTBOX_PARTITION=30m: not a partition width: a whole number of hours from 1h to 7d"},
		{name: "PartitionTooWide", env: []string{"OUTBOX_PARTITION=8d"}, want: "OUTBOX_PARTITION=8d: not a partition width"},
		{name: "ShutdownTimeout", env: []string{"SHUTDOWN_TIMEOUT=30"}, want: "SHUTDOWN_TIMEOUT=30: not a duration"},
		{
			name: "DatabaseURLURL", env: []string{"DATABASE_URL=postgres://forwarder:S3cret-Pw@db:port/forwarder"},
			want: "DATABASE_URL: not a PostgreSQL connection string", secret: "S3cret-Pw",
		},
		{
			name: "DatabaseURLKeyValue", env: []string{"DATABASE_URL=host=db password=S3cret-Kv port=abc"},
			want: "DATABASE_URL: not a PostgreSQL connection string", secret: "S3cret-Kv",
		},
		{name: "NotAURL", env: []string{"DATABASE_URL=not a url"}, want: "DATABASE_URL: not a PostgreSQL connection string", secret: "not a url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{run, lint} {
				env := append(append([]string{}, tc.env...), credentials...)
				out, err := runAtRoot(t, env, args...)
				if err == nil || !strings.Contains(out, tc.want) {
					t.Errorf("forwarder %s with %v: err %v, want a failure saying %q:\n%s", strings.Join(args, " "), tc.env, err, tc.want, out)
				}
				for _, s := range []string{tc.secret, "Pwd-0f-the-platform"} {
					if s != "" && strings.Contains(out, s) {
						t.Errorf("forwarder %s printed the secret %q:\n%s", strings.Join(args, " "), s, out)
					}
				}
				// Checked before anything starts: no log line at all, so no
				// component was created and nothing tried to connect.
				if strings.Contains(out, "level=") {
					t.Errorf("forwarder %s logged before refusing the environment:\n%s", strings.Join(args, " "), out)
				}
			}
		})
	}

	t.Run("CredentialsRequiredToRunNotToLint", func(t *testing.T) {
		t.Parallel()
		out, err := runAtRoot(t, nil, run...)
		for _, v := range []string{"PLATFORM_ACCESS_NAME is not set", "PLATFORM_ACCESS_PWD is not set"} {
			if err == nil || !strings.Contains(out, v) {
				t.Errorf("run without credentials: err %v, want %q:\n%s", err, v, out)
			}
		}
		if strings.Contains(out, "level=") {
			t.Errorf("run without credentials logged before refusing:\n%s", out)
		}
		if out, err := runAtRoot(t, nil, lint...); err != nil {
			t.Errorf("lint without credentials failed: %v\n%s", err, out)
		}
	})

	t.Run("OnlyVariablesTheConfigUses", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		conf := filepath.Join(dir, "own.yaml")
		own := "input:\n  generate:\n    count: 1\n    interval: ${OWN_INTERVAL:1s}\n    mapping: 'root = \"x\"'\noutput:\n  drop: {}\n"
		if err := os.WriteFile(conf, []byte(own), 0o644); err != nil {
			t.Fatal(err)
		}
		env := []string{"FORWARD_TIMEOUT=abc", "PLATFORM_TZ=Nowhere/City", "HTTP_ADDR=bogus"}
		if out, err := runAtRoot(t, env, "lint", conf); err != nil {
			t.Errorf("lint of a config that uses none of our variables failed on them: %v\n%s", err, out)
		}
		if out, err := runAtRoot(t, env, "-c", conf); err != nil || strings.Contains(out, "FORWARD_TIMEOUT") {
			t.Errorf("a config that uses none of our variables was judged by them: %v\n%s", err, out)
		}
	})

	t.Run("Streams", func(t *testing.T) {
		t.Parallel()
		out, err := runAtRoot(t, append([]string{"FORWARD_TIMEOUT=abc"}, credentials...), "streams", "--no-api", "pipelines/forwarder.yaml")
		if err == nil || !strings.Contains(out, "FORWARD_TIMEOUT=abc: not a duration") {
			t.Errorf("streams with FORWARD_TIMEOUT=abc: err %v, want the variable named:\n%s", err, out)
		}
	})

	t.Run("ALeaseARequestCouldOutliveIsRefused", func(t *testing.T) {
		t.Parallel()
		out, err := runAtRoot(t, []string{"CLAIM_LEASE=5s", "FORWARD_TIMEOUT=5s"}, lint...)
		if err == nil || !strings.Contains(out, "CLAIM_LEASE=5s must exceed FORWARD_TIMEOUT=5s: set CLAIM_LEASE to at least 6s") {
			t.Errorf("lint with CLAIM_LEASE=FORWARD_TIMEOUT: err %v, want the lease refused naming both variables:\n%s", err, out)
		}
		// Any held row count is fine: held rows keep their leases.
		if out, err := runAtRoot(t, []string{"OUTBOX_MAX_UNACKED=100000"}, lint...); err != nil {
			t.Errorf("lint with OUTBOX_MAX_UNACKED=100000: %v\n%s", err, out)
		}
	})
}
