package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// proc is one bin/forwarder child process. Its stdout and stderr go to a
// file, kept for the test's log checks and shown when something fails.
type proc struct {
	name     string
	httpAddr string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{}
	state    *os.ProcessState // once done
	waitErr  error            // once done
	// signalled records the signal we sent it, 0 when none: a process that
	// exits without one exited by itself.
	signalled atomic.Int32
	// mayExit is set for a process expected to exit by itself.
	mayExit bool
}

// startProc runs forwarderBin -c pipelines/forwarder.yaml from the repository
// root with exactly env (plus PATH and HOME, so nothing from the developer's
// shell changes the pipeline) and a fresh loopback HTTP_ADDR. It is killed
// by PID when the test ends, whatever happened.
func startProc(t *testing.T, name string, env map[string]string) *proc {
	t.Helper()
	logDir := t.TempDir()
	if dir := os.Getenv("E2E_LOG_DIR"); dir != "" {
		// Kept after the run, for a CI artifact or a post-mortem.
		logDir = filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := &proc{
		name:     name,
		httpAddr: freeAddr(t),
		logPath:  filepath.Join(logDir, name+".log"),
		done:     make(chan struct{}),
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatalf("creating %s: %v", p.logPath, err)
	}
	defer logFile.Close() // the child has its own descriptor

	all := map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"), "TMPDIR": os.TempDir()}
	for k, v := range env {
		all[k] = v
	}
	all["HTTP_ADDR"] = p.httpAddr
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cmd := exec.Command(forwarderBin, "-c", "pipelines/forwarder.yaml")
	cmd.Dir = repoRoot
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+all[k])
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so a Ctrl-C on `go test` reaches the test, which
	// then kills it; Pdeathsig kills it should the test binary die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", forwarderBin, err)
	}
	p.cmd = cmd
	go func() {
		p.waitErr = cmd.Wait()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			if err := p.signal(syscall.SIGKILL); err != nil {
				t.Error(err)
			}
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				t.Errorf("%s (pid %d) did not die after SIGKILL", p.name, p.pid())
			}
		}
	})
	t.Logf("%s started: pid %d, http %s, log %s", name, p.pid(), p.httpAddr, p.logPath)
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process, by its PID only. A process that is
// already gone is not an error.
func (p *proc) signal(sig syscall.Signal) error {
	p.signalled.Store(int32(sig))
	if err := syscall.Kill(p.pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %v to %s (pid %d): %w", sig, p.name, p.pid(), err)
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
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s (pid %d) still running 30 s after SIGKILL", p.name, p.pid())
	}
}

// term sends SIGTERM, leaving the process to stop by itself.
func (p *proc) term(t *testing.T) {
	t.Helper()
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// waitExit waits up to limit for the process to exit by itself and returns
// its exit code; exited is false when it was still running at the limit.
func (p *proc) waitExit(limit time.Duration) (code int, exited bool) {
	select {
	case <-p.done:
		return p.state.ExitCode(), true
	case <-time.After(limit):
		return -1, false
	}
}

// waitUp waits until the process answers /ping, or fails the test when it
// exits first or does not answer before the deadline.
func (p *proc) waitUp(t *testing.T, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		if !p.alive() {
			t.Fatalf("%s exited during start-up (%v):\n%s", p.name, p.waitErr, p.tail(4000))
		}
		resp, err := client.Get("http://" + p.httpAddr + "/ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer /ping on %s after %s:\n%s", p.name, p.httpAddr, within, p.tail(4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
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
func (p *proc) tail(n int) string {
	b := p.logBytes()
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

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

// freeAddr is a loopback address with a port nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}
