package e2e_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// TestPasswordNeverLeaks provokes every path that might print or store the
// platform password (docs/guarantees.md #11) and then searches for
// it in every log line of every process and in every text or binary column
// of both outbox tables: start-up with a config the forwarder rejects,
// debug logging, 401 answers to a wrong password, transient platform
// errors, malformed messages, the /metrics page. (Every other scenario also
// checks its logs and rows for the password.)
func TestPasswordNeverLeaks(t *testing.T) {
	scenario(t, light, 15*time.Second)
	s := newStack(t, stackOptions{
		env:    map[string]string{"LOG_LEVEL": "DEBUG", "FORWARD_MAX_ATTEMPTS": "100"},
		faults: mockplatform.Faults{Errcode999: 0.1, HTTP5xx: 0.1},
	})
	s.allowAuthFailures = true
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Start-up refused: a claim lease shorter than the request timeout, and
	// a missing password. Both must exit non-zero, saying why, without
	// echoing the configuration's secrets.
	bad := s.startExpectingExit("forwarder-bad-lease", map[string]string{"CLAIM_LEASE": "500ms"})
	if out := string(bad.logBytes()); !strings.Contains(strings.ToLower(out), "lease") {
		t.Errorf("a start-up with CLAIM_LEASE below FORWARD_TIMEOUT failed without naming the lease:\n%s", bad.tail(3000))
	}
	noPwd := s.startExpectingExit("forwarder-no-password", map[string]string{"PLATFORM_ACCESS_PWD": ""})
	if !strings.Contains(string(noPwd.logBytes()), "PLATFORM_ACCESS_PWD") {
		t.Errorf("a start-up without PLATFORM_ACCESS_PWD failed without naming the variable:\n%s", noPwd.tail(3000))
	}

	src := s.newSource(eventgen.SourceConfig{DuplicateRate: 0.02, MalformedRate: 0.05, MissingIDRate: 0.02})
	n := load(1_500, 600)
	s.produce(src, n)

	// A wrong password (which contains the right one, so a leak of either
	// shows): every request is answered 401 and retried.
	wrong := s.start("forwarder-wrong-password", map[string]string{"PLATFORM_ACCESS_PWD": accessPwd + "-stale"})
	if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.AuthFailures >= 200 }); err != nil {
		s.dumpLogs()
		t.Fatal(err)
	}
	wrong.term(t)
	if code, exited := wrong.waitExit(shutdownTimeout + 20*time.Second); !exited || code != 0 {
		t.Errorf("the forwarder with the wrong password did not stop cleanly on SIGTERM (exited %v, status %d)", exited, code)
	}

	// The right password: everything goes through, with transient errors.
	p := s.start("forwarder", nil)
	s.waitSettled(3 * time.Minute)
	status, metrics, err := p.get(ctx, "/metrics")
	if err != nil || status != 200 {
		t.Errorf("GET /metrics: status %d, %v", status, err)
	}
	if bytes.Contains(metrics, []byte(accessPwd)) {
		t.Errorf("/metrics shows the platform password")
	}
	r := s.verify() // includes every column of both tables

	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	var lines, leaks int
	for _, p := range procs {
		for _, line := range strings.Split(string(p.logBytes()), "\n") {
			if line == "" {
				continue
			}
			lines++
			if strings.Contains(line, accessPwd) {
				leaks++
				t.Errorf("%s logged the password: %s", p.name, line)
			}
		}
	}
	if lines < 50 {
		t.Errorf("only %d log lines from %d processes: the search saw too little to mean anything", lines, len(procs))
	}
	st := s.platform.Stats()
	t.Logf("searched %d log lines of %d processes (debug level), %d bytes of /metrics and both tables: %d leaks; "+
		"platform answered %d x 401, %d x errcode 999, %d x 500; %s",
		lines, len(procs), len(metrics), leaks, st.AuthFailures, st.Errcode999, st.HTTP5xx, r)
}

// startExpectingExit starts a forwarder whose start-up must fail, waits for
// it to exit, and fails the test unless it exited with a non-zero status.
func (s *stack) startExpectingExit(name string, extra map[string]string) *proc {
	s.t.Helper()
	p := startProc(s.t, name, mergeEnv(s.env, extra))
	code, exited := s.awaitExit(p, 60*time.Second)
	switch {
	case !exited:
		s.t.Errorf("%s did not refuse to start within 60 s:\n%s", name, p.tail(3000))
	case code == 0:
		s.t.Errorf("%s exited with status 0, want a refusal:\n%s", name, p.tail(3000))
	}
	return p
}
