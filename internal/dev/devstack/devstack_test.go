package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
	"github.com/twmb/franz-go/pkg/kgo"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// buildForwarder builds cmd/forwarder once for the package's tests, or
// returns $FORWARDER_BIN when set (`make test` builds bin/forwarder first and
// passes it).
func buildForwarder(t *testing.T, root string) string {
	t.Helper()
	if bin := os.Getenv("FORWARDER_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("FORWARDER_BIN: %v", err)
		}
		return testinputs.Forwarder(t, bin)
	}
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if buildDir, buildErr = os.MkdirTemp("", "devstack-forwarder-"); buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "forwarder")
		cmd := exec.Command(goBin, "build", "-o", builtBin, "./cmd/forwarder")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the forwarder: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return testinputs.Forwarder(t, builtBin)
}

// TestSmoke runs the dev stack as `make run` does, with the real forwarder
// and pipeline: deliveries reach the mock platform, progress is reported
// from the database, /metrics answers, and everything stops cleanly, all
// within 60 s. A second start on the same directory reuses the database.
func TestSmoke(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	dir := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs bytes.Buffer
	s, err := Start(ctx, Config{
		Dir:           dir,
		WorkDir:       root,
		Forwarder:     bin,
		HTTPAddr:      "127.0.0.1:0",
		Rate:          50,
		DuplicateRate: 0.05,
		MalformedRate: 0.05,
		Faults:        mockplatform.Faults{Errcode999: 0.1, HTTP5xx: 0.05},
		ForwarderLog:  &logs,
		Logf:          t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = s.Stop()
		}
	}()

	const want = 20
	if err := s.Platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= want }); err != nil {
		t.Fatalf("%v\nforwarder log:\n%s", err, tail(logs.String(), 3000))
	}

	// The progress lines read the same deliveries back from the database.
	var out bytes.Buffer
	if err := s.Run(ctx, 2500*time.Millisecond, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 3 || lines[0] != FormatHeader() || !regexp.MustCompile(`^\d\d:\d\d:\d\d +\d+ +\d+`).MatchString(lines[len(lines)-1]) {
		t.Fatalf("progress output, want a header and progress lines:\n%s", out.String())
	}
	p, err := s.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Rows.Delivered < want || p.Produced.Produced < p.Rows.Delivered || p.Rows.Persisted < p.Rows.Delivered {
		t.Errorf("progress %+v: want at least %d delivered rows, no more than persisted or produced", p, want)
	}
	if p.Platform.AuthFailures != 0 || p.Platform.BadRequests != 0 {
		t.Errorf("the platform refused requests: %+v", p.Platform)
	}

	resp, err := http.Get(s.Forwarder.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(metrics, []byte("forwarder_records_pending")) {
		t.Errorf("GET %s: %d, forwarder_records_pending missing:\n%s", s.Forwarder.MetricsURL(), resp.StatusCode, tail(string(metrics), 2000))
	}

	// Stopping as make run does: the generator first, then the forwarder
	// once it has a row for every message produced, so that nothing is
	// left in the dev broker, which keeps nothing between runs.
	if err := s.StopGenerator(); err != nil {
		t.Fatal(err)
	}
	drained, ok := s.Drain(ctx, 20*time.Second)
	if !ok || drained.Rows.Persisted != drained.Produced.Rows() {
		t.Fatalf("drain: %v, %+v: want a row for each of the %d messages produced", ok, drained.Rows, drained.Produced.Rows())
	}
	if err := s.StopForwarders(); err != nil {
		t.Fatalf("stopping the forwarder: %v\nforwarder log:\n%s", err, tail(logs.String(), 3000))
	}
	left, err := s.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := left.Rows; r.Persisted != drained.Rows.Persisted || r.Delivered+r.Failed+r.Waiting+r.Retrying+r.InProgress != r.Persisted {
		t.Errorf("rows after the forwarder stopped: %+v, want the %d drained, each in one state", r, drained.Rows.Persisted)
	}

	stopErr := make(chan error, 1)
	go func() { stopErr <- s.Stop() }()
	select {
	case err := <-stopErr:
		stopped = true
		if err != nil {
			t.Fatalf("stopping: %v\nforwarder log:\n%s", err, tail(logs.String(), 3000))
		}
	case <-ctx.Done():
		t.Fatal("the stack did not stop within 60 s of starting")
	}
	if s.Forwarder.Err() != nil {
		t.Errorf("forwarder exit: %v", s.Forwarder.Err())
	}
	logged, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(logged) == 0 {
		t.Error("the forwarder log is empty")
	}
	if bytes.Contains(logged, []byte(s.accessPwd)) || strings.Contains(out.String(), s.accessPwd) {
		t.Error("the platform password appears in the forwarder log or the progress output")
	}

	// The next run finds the cluster and this run's rows.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel2()
	s2, err := Start(ctx2, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	if s2.mark < p.Rows.Persisted {
		t.Errorf("second run starts after row %d, want the first run's %d rows kept", s2.mark, p.Rows.Persisted)
	}
	if err := s2.Stop(); err != nil {
		t.Error(err)
	}
}

// TestRequeueAfterBusyPlatform is the operator's morning after: the
// platform answered every request "busy, retry" (errcode 999) until every
// row ran out of attempts (an outage would not do it: while the platform is
// unavailable the breaker keeps attempts from being spent); once it answers
// normally, `forwarder outbox requeue` (the real command) sets them PENDING
// and the running forwarder, woken by the requeue's NOTIFY, delivers them
// all.
func TestRequeueAfterBusyPlatform(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{
		Dir:         t.TempDir(),
		WorkDir:     root,
		Forwarder:   bin,
		HTTPAddr:    "127.0.0.1:0",
		NoGenerator: true,
		Env:         map[string]string{"FORWARD_MAX_ATTEMPTS": "2", "FORWARD_RETRY_INITIAL": "100ms"},
		Logf:        t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.Platform.SetFaults(mockplatform.Faults{Errcode999: 1}); err != nil {
		t.Fatal(err)
	}

	const n = 30
	g, err := eventgen.New(eventgen.Config{Brokers: s.Brokers, Count: n})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows := func(what string, cond func(outboxdb.Progress) bool) {
		t.Helper()
		for {
			p, err := outboxdb.ReadProgress(ctx, s.Pool(), s.mark)
			if err == nil && cond(p) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s: rows %+v, platform %+v", what, p, s.Platform.Stats())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitRows("every row FAILED", func(p outboxdb.Progress) bool { return p.Failed == n })
	if st := s.Platform.Stats(); st.Accepted != 0 || st.Errcode999 < 2*n {
		t.Fatalf("platform while busy: %+v, want %d busy answers and nothing accepted", st, 2*n)
	}

	if err := s.Platform.SetFaults(mockplatform.Faults{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "outbox", "requeue")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+s.DatabaseURL)
	out, err := cmd.CombinedOutput()
	// The command first says what it will change, then what it did.
	if err != nil || !strings.HasSuffix(string(out), fmt.Sprintf("\n%d rows requeued\n", n)) {
		t.Fatalf("outbox requeue: %v: %q", err, out)
	}
	if err := s.Platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted == n }); err != nil {
		t.Fatal(err)
	}
	waitRows("every row SUCCESS", func(p outboxdb.Progress) bool { return p.Delivered == n })
	var audits int
	if err := s.Pool().QueryRow(ctx, "SELECT count(*) FROM forward_retry_logs WHERE result_status = 'REQUEUED'").Scan(&audits); err != nil {
		t.Fatal(err)
	}
	if audits != n {
		t.Errorf("%d REQUEUED audit rows, want %d", audits, n)
	}
	if err := s.Stop(); err != nil {
		t.Error(err)
	}
}

// TestStartFailsCleanly checks that a forwarder that cannot start is
// reported with its log, and that the rest of the stack is stopped.
func TestStartFailsCleanly(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	dir := t.TempDir()
	// A "forwarder" that fails at once, like one given a broken config.
	bin := filepath.Join(dir, "broken-forwarder")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'config error: no such field' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, WorkDir: root, Forwarder: bin, HTTPAddr: "127.0.0.1:0", NoGenerator: true})
	if err == nil {
		_ = s.Stop()
		t.Fatal("Start succeeded with a forwarder that exits")
	}
	if !strings.Contains(err.Error(), "config error: no such field") {
		t.Errorf("error %q does not show the forwarder's output", err)
	}
	// PostgreSQL was stopped: starting again on the same directory works.
	s, err = Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatalf("restarting on the same directory: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Error(err)
	}
	if _, err := Start(ctx, Config{Dir: dir, WorkDir: root, Forwarder: filepath.Join(dir, "missing")}); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing binary: %v, want a not-found error", err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestDrainWaitsForTheGroupToReadEverything: a drain is over when the
// forwarder's consumer group has committed every record in the broker, not
// when this run has a row for each message its generator produced (a
// record may make no row: one with the bytes and Kafka coordinates of an
// earlier run's row is a redelivery to the outbox). Records the generator
// did not produce count too.
func TestDrainWaitsForTheGroupToReadEverything(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Dir: t.TempDir(), WorkDir: root, Forwarder: bin, NoGenerator: true, NoForwarder: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop() }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 3 {
		rec := &kgo.Record{Topic: eventgen.DefaultVehicleTopic, Value: []byte(fmt.Sprintf(`{"messageId":"drain-%d"}`, i))}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if p, ok := s.Drain(ctx, time.Second); ok {
		t.Fatalf("drained with no forwarder reading the 3 records: %+v", p.Rows)
	}
	if _, err := s.StartForwarder(ctx, ForwarderOptions{HTTPAddr: "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	p, ok := s.Drain(ctx, time.Minute)
	if !ok || p.Rows.Persisted != 3 {
		t.Fatalf("drain: %v, %+v: want the 3 records read and persisted", ok, p.Rows)
	}
}

// TestLeftoverRowsOfEarlierRuns: a run counts the rows earlier runs left to
// send (PENDING and IN_PROGRESS; not those delivered or FAILED), which the
// forwarder sends too and the platform's figures include while the run's
// own progress does not: the banner names them.
func TestLeftoverRowsOfEarlierRuns(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Leftover != 0 {
		t.Errorf("a new database has %d leftover rows", s.Leftover)
	}
	db := fixture.New(t, s.pool)
	db.Insert(
		fixture.Row{Key: "waiting-1"}, fixture.Row{Key: "waiting-2"},
		fixture.Row{Key: "in-flight", Status: "IN_PROGRESS"},
		fixture.Row{Key: "failed", Status: "FAILED"},
	)
	db.InsertFinished(2)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}

	s2, err := Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	if s2.Leftover != 3 {
		t.Errorf("the next run counts %d rows left to send, want 3 (two PENDING, one IN_PROGRESS)", s2.Leftover)
	}
}
