package httpforwarder

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	// The components of the real binary, so that lint sees what it sees.
	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
)

const (
	testDSN = "postgres://nobody@127.0.0.1:1/none"
	testURL = "http://127.0.0.1:1"
)

// TestStartupChecks: the constructor refuses configs that cannot work, with
// an error naming what to fix, and never touches the network (the DSN and
// URL point nowhere).
func TestStartupChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		yaml string
		want string // "" means it must construct
	}{
		{name: "Valid", yaml: baseYAML(testDSN, testURL, "lease: 60s\ntimeout: 10s")},
		{name: "NoLeaseIsUnchecked", yaml: baseYAML(testDSN, testURL, "timeout: 10m")},
		// The shortest timeout accepted, and below it: no request could
		// complete, so nothing would be delivered.
		{name: "ShortestTimeout", yaml: baseYAML(testDSN, testURL, "timeout: 1ms")},
		{
			name: "TimeoutTooShortToDeliver",
			yaml: baseYAML(testDSN, testURL, "timeout: 1ns"),
			want: "field timeout: must be at least 1ms, got 1ns (FORWARD_TIMEOUT): too short for a request to the platform, nothing would be delivered",
		},
		{name: "ZeroTimeout", yaml: baseYAML(testDSN, testURL, "timeout: 0s"), want: "field timeout: must be at least 1ms, got 0s"},
		{name: "LargestMaxInFlight", yaml: baseYAML(testDSN, testURL, "max_in_flight: 10000")},
		{
			name: "MaxInFlightTooLarge", yaml: baseYAML(testDSN, testURL, "max_in_flight: 1000000000"),
			want: "field max_in_flight: must be from 1 to 10000, got 1000000000 (FORWARD_MAX_IN_FLIGHT)",
		},
		{name: "TheMostAttempts", yaml: baseYAML(testDSN, testURL, "retry:\n  max_attempts: 2147483647")},
		{
			name: "MoreAttemptsThanARowCounts", yaml: baseYAML(testDSN, testURL, "retry:\n  max_attempts: 2147483648"),
			want: "field retry.max_attempts: must be from 1 to 2147483647 (a row counts its attempts in an integer column), got 2147483648 (FORWARD_MAX_ATTEMPTS)",
		},
		{name: "SmallestRateLimit", yaml: baseYAML(testDSN, testURL, "rate_limit: 1e-12")},
		{name: "InfiniteRateLimit", yaml: baseYAML(testDSN, testURL, "rate_limit: .inf"), want: "field rate_limit: must be a number of at least 0, got +Inf"},
		{
			name: "EmptyAccessName",
			yaml: "dsn: " + testDSN + "\nurl: " + testURL + "\naccess_name: ''\naccess_pwd: x",
			want: "access_name is not set: set the environment variable PLATFORM_ACCESS_NAME",
		},
		{
			name: "MissingAccessPwd",
			yaml: "dsn: " + testDSN + "\nurl: " + testURL + "\naccess_name: x",
			want: "access_pwd is not set: set the environment variable PLATFORM_ACCESS_PWD",
		},
		{
			name: "TimeoutNotBelowLease",
			yaml: baseYAML(testDSN, testURL, "timeout: 10s\nlease: 10s"),
			want: "timeout (10s) must be less than lease (10s): CLAIM_LEASE must exceed FORWARD_TIMEOUT",
		},
		{
			name: "BadLease",
			yaml: baseYAML(testDSN, testURL, "lease: soon"),
			want: `field lease: "soon" is not a duration`,
		},
		{
			name: "BadExpression",
			yaml: baseYAML(testDSN, testURL, "rules:\n  - when: 'status == 200'\n    outcome: success\n  - when: 'body?.errcode =='\n    outcome: no_retry"),
			want: `rules[1] (no_retry): when "body?.errcode ==" does not compile: unexpected token EOF`,
		},
		{
			name: "BadJitter",
			yaml: baseYAML(testDSN, testURL, "retry:\n  jitter: 1.5"),
			want: "field retry.jitter: must be in [0, 1), got 1.5",
		},
		{
			name: "MaxBelowInitial",
			yaml: baseYAML(testDSN, testURL, "retry:\n  initial: 10s\n  max: 1s"),
			want: "field retry.max (1s) must not be less than retry.initial (10s)",
		},
		{
			name: "ZeroMaxInFlight",
			yaml: baseYAML(testDSN, testURL, "max_in_flight: 0"),
			want: "field max_in_flight: must be from 1 to 10000, got 0",
		},
		{
			name: "BadDSN",
			yaml: baseYAML("postgres://%zz", testURL, ""),
			want: "field dsn: parsing database dsn",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conf, err := httpForwarderSpec().ParseYAML(tc.yaml, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = newHTTPForwarderFromParsed(conf, service.MockResources())
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			if err != nil && (strings.Contains(err.Error(), testAccessName) || strings.Contains(err.Error(), testAccessPwd)) {
				t.Fatalf("error shows a credential: %v", err)
			}
		})
	}
}

// TestLint runs the real `forwarder lint` command (Benthos's CLI with this
// package's plugins) on config files. It swaps os.Stderr, so it is not
// parallel.
func TestLint(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, v := range []string{"PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD"} {
		if _, set := os.LookupEnv(v); set {
			t.Fatalf("%s is set in the test environment", v)
		}
	}

	t.Run("ExamplesPassWithoutCredentials", func(t *testing.T) {
		code, stderr := runCLI(t, "lint", write("forward.yaml", exampleForwardYAML), write("rules.yaml", exampleRulesYAML))
		if code != 0 {
			t.Fatalf("lint exit %d:\n%s", code, stderr)
		}
	})

	t.Run("BadExpressionNamed", func(t *testing.T) {
		code, stderr := runCLI(t, "lint", write("bad_rule.yaml", `
output:
  http_forwarder:
    dsn: postgres://localhost/forwarder
    url: http://localhost:8080/mch/business
    rules:
      - when: 'status == 200 && body?.result == 0'
        outcome: success
      - when: 'body?.errcode in ["998"'
        outcome: no_retry
`))
		if code != 1 {
			t.Fatalf("lint exit %d, want 1:\n%s", code, stderr)
		}
		for _, want := range []string{"bad_rule.yaml", `rules[1] (no_retry): when "body?.errcode in [\"998\"" does not compile`} {
			if !strings.Contains(stderr, want) {
				t.Errorf("lint output lacks %q:\n%s", want, stderr)
			}
		}
	})

	t.Run("BadOutcomeNamed", func(t *testing.T) {
		code, stderr := runCLI(t, "lint", write("bad_outcome.yaml", `
output:
  http_forwarder:
    dsn: postgres://localhost/forwarder
    url: http://localhost:8080/mch/business
    rules:
      - when: 'status == 200'
        outcome: maybe
`))
		if code != 1 || !strings.Contains(stderr, "maybe") {
			t.Fatalf("lint exit %d, want 1 naming the outcome:\n%s", code, stderr)
		}
	})

	t.Run("LeaseNotAboveTimeout", func(t *testing.T) {
		code, stderr := runCLI(t, "lint", write("lease.yaml", `
output:
  http_forwarder:
    dsn: postgres://localhost/forwarder
    url: http://localhost:8080/mch/business
    timeout: 30s
    lease: 20s
`))
		if code != 1 || !strings.Contains(stderr, "timeout (30s) must be less than lease (20s): CLAIM_LEASE must exceed FORWARD_TIMEOUT") {
			t.Fatalf("lint exit %d, want 1 with the lease error:\n%s", code, stderr)
		}
	})
}

// runCLI runs Benthos's CLI in process and returns its exit code and stderr.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	orig := os.Stderr
	os.Stderr = w
	var buf bytes.Buffer
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(&buf, r)
		close(copied)
	}()
	code, err := service.RunCLIToCode(context.Background(), service.CLIOptSetArgs(append([]string{"forwarder"}, args...)...))
	os.Stderr = orig
	_ = w.Close()
	<-copied
	_ = r.Close()
	if err != nil {
		buf.WriteString(err.Error())
	}
	return code, buf.String()
}

// TestStreamBuilderRejectsBadRule: a stream built from YAML lints its
// outputs, so an embedded config fails the same way.
func TestStreamBuilderRejectsBadRule(t *testing.T) {
	t.Parallel()
	sb := service.NewStreamBuilder()
	err := sb.AddOutputYAML(`
http_forwarder:
  dsn: postgres://localhost/forwarder
  url: http://localhost:8080
  access_name: a
  access_pwd: b
  rules:
    - when: 'status = 200'
      outcome: success
`)
	if err == nil || !strings.Contains(err.Error(), `rules[0] (success): when "status = 200" does not compile`) {
		t.Fatalf("AddOutputYAML error = %v, want the rule named", err)
	}
}
