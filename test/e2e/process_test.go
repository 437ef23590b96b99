package e2e_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// proc is one bin/forwarder child process. Its stdout and stderr go to a
// file, kept for the test's log checks and shown when something fails.
type proc struct {
	*childproc.Process
	name     string
	httpAddr string
	logPath  string
	// signalled records the signal we sent it, 0 when none: a process that
	// exits without one exited by itself.
	signalled atomic.Int32
	// mayExit is set for a process expected to exit by itself.
	mayExit bool
}

// build is a forwarder binary and the checkout it runs in: its pipeline
// and mappings are read relative to the working directory.
type build struct{ bin, dir string }

// current is the forwarder of this run, in the repository root.
func current(t *testing.T) build {
	return build{bin: testinputs.Forwarder(t, forwarderBin), dir: repoRoot}
}

// startProc runs this run's forwarder (current) as startBuild does.
func startProc(t *testing.T, name string, env map[string]string) *proc {
	t.Helper()
	return startBuild(t, name, current(t), env)
}

// startBuild runs b's binary -c pipelines/forwarder.yaml in b's checkout
// with exactly env (plus PATH and HOME, so nothing from the developer's
// shell changes the pipeline) and a fresh loopback HTTP_ADDR. It is killed
// by PID when the test ends, whatever happened.
func startBuild(t *testing.T, name string, b build, env map[string]string) *proc {
	t.Helper()
	logDir := t.TempDir()
	if dir := os.Getenv("E2E_LOG_DIR"); dir != "" {
		// Kept after the run, for a CI artifact or a post-mortem.
		logDir = filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, httpAddr: addr, logPath: filepath.Join(logDir, name+".log")}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatalf("creating %s: %v", p.logPath, err)
	}
	defer logFile.Close() // the child has its own descriptor

	all := map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"), "TMPDIR": os.TempDir()}
	maps.Copy(all, env)
	all["HTTP_ADDR"] = p.httpAddr
	// Its own process group, so a Ctrl-C on `go test` reaches the test, which
	// then kills it; it is killed too should the test binary die first.
	p.Process, err = childproc.Start(childproc.Spec{
		Path: b.bin, Args: []string{"-c", "pipelines/forwarder.yaml"}, Dir: b.dir,
		Env: all, Output: logFile, ParentDeath: syscall.SIGKILL,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.Exited() {
			return
		}
		if err := p.signal(syscall.SIGKILL); err != nil {
			t.Error(err)
		}
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			t.Errorf("%s (pid %d) did not die after SIGKILL", p.name, p.Pid())
		}
	})
	t.Logf("%s started: pid %d, http %s, log %s", name, p.Pid(), p.httpAddr, p.logPath)
	return p
}

// handedOut holds every HTTP address given to a forwarder in this run.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// freeAddr is a loopback address nothing listens on that no forwarder of
// this run was given before. The scenarios run in parallel: a port freed by
// one forwarder's exit, or found free by two scenarios at once, must not go
// to a second forwarder, whose scenario would then read the first's
// /metrics.
func freeAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		addr, err := childproc.FreeAddr()
		if err != nil {
			return "", err
		}
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no loopback port left that no forwarder of this run had")
}

// signal sends sig to the process, by its PID only, and records it. A
// process that is already gone is not an error.
func (p *proc) signal(sig syscall.Signal) error {
	p.signalled.Store(int32(sig))
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

// kill9 crashes the process and waits until it is gone.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	if err := p.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s (pid %d) still running 30 s after SIGKILL", p.name, p.Pid())
	}
}

// term sends SIGTERM once the process is ready for it, leaving the
// process to stop by itself.
//
// Benthos installs its SIGTERM handler only after the stream is built: a
// SIGTERM before that ends the process at once (it holds no claim then:
// package launch, TestSigtermWhileStarting), with none of the graceful
// shutdown these tests watch. So term waits for the last line Benthos logs
// before the handler ("Launching a forwarder instance") and lets the few
// statements after it run.
func (p *proc) term(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.countLines(launchedLine) == 0 {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) never logged %q, so cannot take a SIGTERM gracefully (%s):\n%s", p.name, p.Pid(), launchedLine, p.state(), p.tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// launchedLine is what Benthos logs just before it installs its SIGTERM
// handler.
const launchedLine = "Launching a forwarder instance"

// joinedLine is logged once the Kafka input has connected: it is joining its
// consumer group, or has joined.
const joinedLine = "kafka_franz: consuming as group"

// state says whether the process runs, and how it ended if not.
func (p *proc) state() string {
	if !p.Exited() {
		return "running"
	}
	how := "exit status 0"
	if err := p.Err(); err != nil {
		how = err.Error()
	}
	if sig := syscall.Signal(p.signalled.Load()); sig != 0 {
		return fmt.Sprintf("exited after we sent %v: %s", sig, how)
	}
	return "exited by itself: " + how
}

// waitExit waits up to limit for the process to exit by itself and returns
// its exit code; exited is false when it was still running at the limit.
func (p *proc) waitExit(limit time.Duration) (code int, exited bool) {
	select {
	case <-p.Done():
		return p.ExitCode(), true
	case <-time.After(limit):
		return -1, false
	}
}

// waitUp waits until the process answers /ping, or fails the test when it
// exits first or does not answer before the deadline.
func (p *proc) waitUp(t *testing.T, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := p.WaitPing(ctx, p.httpAddr); err != nil {
		t.Fatalf("%s %v:\n%s", p.name, err, p.tail(4000))
	}
}

// claimer is the name p's outbox_retry claims rows under (claimed_by):
// <hostname>-<pid>, its default instance id.
func (p *proc) claimer() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(p.Pid())
}

// get fetches a path of the process's HTTP server.
func (p *proc) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// logBytes is everything the process wrote so far.
func (p *proc) logBytes() []byte {
	b, _ := os.ReadFile(p.logPath)
	return b
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail(n int) string { return childproc.TailFile(p.logPath, int64(n)) }

// countLines counts the log lines containing every one of substrs.
func (p *proc) countLines(substrs ...string) int {
	n := 0
	for _, line := range strings.Split(string(p.logBytes()), "\n") {
		ok := true
		for _, s := range substrs {
			if !strings.Contains(line, s) {
				ok = false
				break
			}
		}
		if ok && line != "" {
			n++
		}
	}
	return n
}
