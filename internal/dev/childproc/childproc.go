// Package childproc runs the child processes of the dev stack, the
// end-to-end suite and the benchmark: bin/forwarder, and the benchmark's
// baselines. Each child runs in its own process group, so that a Ctrl-C in
// the terminal reaches only the parent, which then stops its children in
// order; and each is signalled should the parent die without stopping it.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Spec says what to run and how.
type Spec struct {
	Path string
	Args []string
	Dir  string
	// Environ is the environment to start from: os.Environ() to inherit
	// the parent's, nil for an empty one. Env is added on top, in key order,
	// so that it wins over Environ.
	Environ []string
	Env     map[string]string
	// Output receives stdout and stderr; nil discards them. A file is
	// handed to the child as it is; any other writer is fed through a pipe,
	// which grandchildren the child leaves behind may hold open: Wait then
	// gives up on it a second after the child exits.
	Output io.Writer
	// ParentDeath is the signal the child gets should the parent die first
	// (SIGTERM to let it stop cleanly, SIGKILL for a test harness).
	ParentDeath syscall.Signal
}

// Process is a started child.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // once done
}

// Start starts the child described by s.
func Start(s Spec) (*Process, error) {
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Dir = s.Dir
	cmd.Env = append([]string{}, s.Environ...)
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		cmd.Env = append(cmd.Env, k+"="+s.Env[k]) // later entries win
	}
	cmd.Stdout, cmd.Stderr = s.Output, s.Output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: s.ParentDeath}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the child's exit error once it has exited (nil for exit status 0),
// and nil while it runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// ExitCode is the child's exit status once it has exited, -1 while it runs
// or when a signal ended it.
func (p *Process) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig to the child, by its pid only (not its group). A child
// that is already gone is not an error.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %v to pid %d: %w", sig, p.Pid(), err)
	}
	return nil
}

// Kill ends the child with SIGKILL, like a crash, and waits for it.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// ErrKilled is the error of Stop for a child that had to be killed.
var ErrKilled = errors.New("did not exit after SIGTERM and was killed")

// Stop sends SIGTERM and waits up to timeout for the child to exit, then
// kills it. It returns the exit error of a child that exited in time (nil
// for status 0), or ErrKilled.
func (p *Process) Stop(timeout time.Duration) error {
	if p.Exited() {
		return p.err
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%w (waited %s)", ErrKilled, timeout)
	}
}

// WaitPing waits until the child's HTTP server at addr answers GET /ping
// with 200 (Benthos serves it once the stream is up). It fails when the
// child exits first or ctx ends.
func (p *Process) WaitPing(ctx context.Context, addr string) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited during start-up: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("did not answer /ping on %s: %w", addr, ctx.Err())
		case <-tick.C:
		}
		resp, err := client.Get("http://" + addr + "/ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

// FreeAddr is a loopback address with a port nothing listens on right now
// (FreePort).
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// FreePort is a loopback port nothing listens on right now, for a server
// started later, picked at random outside the kernel's ephemeral range. A
// port from that range (what listening on port 0 gives) can be taken,
// before the server listens, as the source port of any connection the
// machine opens meanwhile; a test run opens thousands, and a server then
// failed to start with "bind: address already in use".
func FreePort() (int, error) {
	low, high := outsideEphemeralPorts(ephemeralPorts())
	for range 1000 {
		if port := low + rand.IntN(high-low); PortFree(port) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("finding a free port: none free of 1000 tried from %d to %d", low, high-1)
}

// PortFree says whether nothing listens on the loopback port p (AddrFree).
func PortFree(p int) bool {
	return AddrFree(net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
}

// AddrFree says whether a server could listen on addr now, by listening on
// it for a moment. It holds syscall.ForkLock meanwhile, as the standard
// library does around the descriptors it creates: a child forked while the
// probe listened would keep the address bound until it execs, and a server
// started on it at once would fail with "address already in use".
func AddrFree(addr string) bool {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralPorts is the kernel's ephemeral range, first and last port
// (/proc/sys/net/ipv4/ip_local_port_range; Linux's default, 32768 to
// 60999, when it cannot be read).
func ephemeralPorts() (first, last int) {
	first, last = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return first, last
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return first, last
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo > hi {
		return first, last
	}
	return lo, hi
}

// minPorts is the fewest ports a range FreePort picks from may hold.
const minPorts = 1000

// outsideEphemeralPorts is the range FreePort picks from, [low, high), given
// the ephemeral range [first, last]: from 20000 (above the ports local
// services commonly use, PostgreSQL's 5432 among them) up to the ephemeral
// range; above it when that leaves fewer than minPorts; any unprivileged
// port when neither side has room (no port is then safe from being taken).
func outsideEphemeralPorts(first, last int) (low, high int) {
	const floor, top = 20000, 65536
	above := max(last+1, floor)
	switch {
	case first-floor >= minPorts:
		return floor, first
	case top-above >= minPorts:
		return above, top
	default:
		return 1024, top
	}
}

// TailFile returns the last n bytes of a file (a child's log), from the
// first whole line, for error messages; "" when it cannot be read.
func TailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	cut := false
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
		cut = true
	}
	b, _ := io.ReadAll(f)
	s := string(b)
	if i := strings.IndexByte(s, '\n'); cut && i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}
