package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/forwarder/forwarder/internal/dev/childproc"
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

	proc *childproc.Process
}

// MetricsURL is where its /metrics is served.
func (f *Forwarder) MetricsURL() string { return "http://" + f.HTTPAddr + "/metrics" }

// Done is closed when the process has exited.
func (f *Forwarder) Done() <-chan struct{} { return f.proc.Done() }

// Err is the process's exit error (nil for exit status 0), once Done.
func (f *Forwarder) Err() error { return f.proc.Err() }

// Pid is the process id.
func (f *Forwarder) Pid() int { return f.proc.Pid() }

// Stop sends SIGTERM and waits up to timeout for the process to exit, then
// kills it. It returns an error unless the process exited with status 0
// within the timeout.
func (f *Forwarder) Stop(timeout time.Duration) error {
	err := f.proc.Stop(timeout)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, childproc.ErrKilled):
		return fmt.Errorf("the forwarder (pid %d) %w", f.Pid(), err)
	default:
		return fmt.Errorf("the forwarder (pid %d) exited: %w", f.Pid(), err)
	}
}

// Kill ends the process with SIGKILL, like a crash, and waits for it.
func (f *Forwarder) Kill() { f.proc.Kill() }

// startForwarder runs bin/forwarder -c pipeline in workDir with env and
// waits until its HTTP server answers /ping.
func startForwarder(ctx context.Context, bin, pipeline, workDir string, env map[string]string, opts ForwarderOptions) (*Forwarder, error) {
	addr := opts.HTTPAddr
	if addr == "" || strings.HasSuffix(addr, ":0") {
		var err error
		if addr, err = childproc.FreeAddr(); err != nil {
			return nil, err
		}
	}
	all := maps.Clone(env)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, opts.Env)
	all["HTTP_ADDR"] = addr

	// Its own process group: a Ctrl-C in the terminal reaches the dev stack
	// only, which then stops the forwarder in order. Should the dev stack
	// die without stopping it, the forwarder is told to stop too.
	proc, err := childproc.Start(childproc.Spec{
		Path: bin, Args: []string{"-c", pipeline}, Dir: workDir,
		Environ: os.Environ(), Env: all, Output: opts.Log, ParentDeath: syscall.SIGTERM,
	})
	if err != nil {
		return nil, err
	}
	f := &Forwarder{HTTPAddr: addr, proc: proc}
	// Up once /ping answers; a config the forwarder rejects ends the process.
	if err := proc.WaitPing(ctx, addr); err != nil {
		_ = proc.Stop(5 * time.Second)
		return nil, fmt.Errorf("the forwarder %w", err)
	}
	return f, nil
}

// resolve makes p absolute against dir unless it already is.
func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}
