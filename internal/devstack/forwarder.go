package devstack

import (
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
	"syscall"
	"time"
)

// ForwarderOptions start one forwarder process.
type ForwarderOptions struct {
	// HTTPAddr is its Benthos HTTP server (/ping, /ready, /metrics); empty
	// or port 0 picks a free loopback port.
	HTTPAddr string
	// Env overrides or adds environment variables on top of the stack's.
	Env map[string]string
	// Log receives its stdout and stderr; nil discards them.
	Log io.Writer
}

// Forwarder is a running bin/forwarder child process.
type Forwarder struct {
	// HTTPAddr is its Benthos HTTP server address.
	HTTPAddr string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// MetricsURL is where its /metrics is served.
func (f *Forwarder) MetricsURL() string { return "http://" + f.HTTPAddr + "/metrics" }

// Done is closed when the process has exited.
func (f *Forwarder) Done() <-chan struct{} { return f.done }

// Err is the process's exit error (nil for exit status 0), once Done.
func (f *Forwarder) Err() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// Pid is the process id.
func (f *Forwarder) Pid() int { return f.cmd.Process.Pid }

// Stop sends SIGTERM and waits up to timeout for the process to exit, then
// kills it. It returns an error unless the process exited with status 0
// within the timeout.
func (f *Forwarder) Stop(timeout time.Duration) error {
	select {
	case <-f.done:
		return f.exitError()
	default:
	}
	if err := f.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("sending SIGTERM to the forwarder (pid %d): %w", f.Pid(), err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-f.done:
		return f.exitError()
	case <-t.C:
		_ = f.cmd.Process.Kill()
		<-f.done
		return fmt.Errorf("the forwarder (pid %d) did not exit within %s of SIGTERM and was killed", f.Pid(), timeout)
	}
}

// Kill ends the process with SIGKILL, like a crash, and waits for it.
func (f *Forwarder) Kill() {
	_ = f.cmd.Process.Kill()
	<-f.done
}

func (f *Forwarder) exitError() error {
	if f.err != nil {
		return fmt.Errorf("the forwarder (pid %d) exited: %w", f.Pid(), f.err)
	}
	return nil
}

// startForwarder runs bin/forwarder -c pipeline in workDir with env and
// waits until its HTTP server answers /ping.
func startForwarder(ctx context.Context, bin, pipeline, workDir string, env map[string]string, opts ForwarderOptions) (*Forwarder, error) {
	addr := opts.HTTPAddr
	if addr == "" || strings.HasSuffix(addr, ":0") {
		var err error
		if addr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	all := map[string]string{}
	for k, v := range env {
		all[k] = v
	}
	for k, v := range opts.Env {
		all[k] = v
	}
	all["HTTP_ADDR"] = addr

	cmd := exec.Command(bin, "-c", pipeline)
	cmd.Dir = workDir
	cmd.Env = os.Environ()
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+all[k]) // later entries win
	}
	cmd.Stdout, cmd.Stderr = opts.Log, opts.Log
	// Its own process group: a Ctrl-C in the terminal reaches the dev stack
	// only, which then stops the forwarder in order. Pdeathsig: should the
	// dev stack die without stopping it, the forwarder is told to stop too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	f := &Forwarder{HTTPAddr: addr, cmd: cmd, done: make(chan struct{})}
	go func() {
		f.err = cmd.Wait()
		close(f.done)
	}()

	// Up once /ping answers; a config the forwarder rejects ends the process.
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.done:
			return nil, fmt.Errorf("the forwarder exited during start-up: %v", f.err)
		case <-ctx.Done():
			_ = f.Stop(5 * time.Second)
			return nil, fmt.Errorf("waiting for the forwarder's /ping on %s: %w", addr, ctx.Err())
		case <-tick.C:
		}
		resp, err := client.Get("http://" + addr + "/ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return f, nil
			}
		}
	}
}

// freeAddr is a loopback address with a port free right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// addrFree reports whether addr can be listened on now.
func addrFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// tailFile returns the last n bytes of a file, for error messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// resolve makes p absolute against dir unless it already is.
func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}
