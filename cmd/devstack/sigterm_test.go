package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

const repoRoot = "../.."

// forwarderBin is $FORWARDER_BIN (make test builds it), else a fresh build.
func forwarderBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("FORWARDER_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "forwarder")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/forwarder")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the forwarder: %v\n%s", err, out)
	}
	return bin
}

// alive reports whether pid is a running process (not gone, not a zombie).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// stack is a dev stack started by startStack and up.
type stack struct {
	cmd    *exec.Cmd
	stdout io.Closer // the read end of its output
	pids   []process // forwarder, PostgreSQL, dev stack: the order they stop in
	mu     sync.Mutex
	out    strings.Builder
	eof    chan struct{} // closed once the output is read to its end
}

type process struct {
	name string
	pid  int
}

func (s *stack) output() string { s.mu.Lock(); defer s.mu.Unlock(); return s.out.String() }

// finalOutput is the whole output of a stack that has stopped: the lines
// its processes wrote last may still be in the pipe when they have exited,
// so it waits (10 s at most) for the reader to reach the end.
func (s *stack) finalOutput(t *testing.T) string {
	t.Helper()
	select {
	case <-s.eof:
	case <-time.After(10 * time.Second):
		t.Log("the dev stack's output was still open 10 s after it stopped")
	}
	return s.output()
}

// startStack runs `go run ./cmd/devstack`, as the docs' examples do, on
// data directory dir, and waits until it says it is up and its processes
// run.
func startStack(t *testing.T, bin, dir string) *stack {
	t.Helper()
	return startStackWith(t, exec.Command("go", append([]string{"run", "./cmd/devstack"}, stackFlags(bin, dir)...)...), dir)
}

// stackFlags are the dev stack's flags for a test: data directory dir,
// forwarder binary bin, any free HTTP port, 20 messages a second.
func stackFlags(bin, dir string) []string {
	return []string{"-data", dir, "-forwarder", bin, "-http-addr", "127.0.0.1:0", "-rate", "20"}
}

// startStackWith starts cmd, a dev stack on data directory dir, from the
// repository's root and waits until it says it is up and its processes run.
func startStackWith(t *testing.T, cmd *exec.Cmd, dir string) *stack {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	return startStackOn(t, cmd, stdout, dir)
}

// startStackOn is startStackWith for a cmd whose output stdout reads (a
// pipe, or a terminal's master side).
func startStackOn(t *testing.T, cmd *exec.Cmd, stdout io.ReadCloser, dir string) *stack {
	t.Helper()
	s := &stack{cmd: cmd, stdout: stdout, eof: make(chan struct{})}
	s.cmd.Dir = repoRoot
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() })

	fwdPid := 0
	pidLine := regexp.MustCompile(`forwarder running \(pid (\d+)\)`)
	ready := make(chan error, 1)
	go func() {
		defer close(s.eof)
		lines := bufio.NewScanner(stdout)
		up := false
		for lines.Scan() {
			line := lines.Text()
			s.mu.Lock()
			s.out.WriteString(line + "\n")
			s.mu.Unlock()
			if m := pidLine.FindStringSubmatch(line); m != nil && !up {
				fwdPid, _ = strconv.Atoi(m[1])
			}
			if strings.Contains(line, "Ctrl-C stops everything") && !up {
				up = true
				ready <- nil
			}
		}
		if !up {
			ready <- errors.New("the dev stack ended before it was up")
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%v:\n%s", err, s.output())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the dev stack did not come up in 3 minutes:\n%s", s.output())
	}
	s.pids = []process{
		{"forwarder", fwdPid},
		{"PostgreSQL", readPid(t, filepath.Join(dir, "pg", "postmaster.pid"))},
		{"dev stack", readPid(t, filepath.Join(dir, "devstack.lock"))},
	}
	for _, p := range s.pids {
		if p.pid == 0 || !alive(p.pid) {
			t.Fatalf("the %s (pid %d) is not running:\n%s", p.name, p.pid, s.output())
		}
	}
	return s
}

// pid is the pid of the stack's process called name.
func (s *stack) pid(name string) int {
	for _, p := range s.pids {
		if p.name == name {
			return p.pid
		}
	}
	panic("no process " + name)
}

// checkStopped fails unless every process of the stack ends within the
// stack's own bounds after what (40 s for the forwarder, 60 s for pg_ctl
// stop), and kills what is left.
func (s *stack) checkStopped(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(150 * time.Second)
	for _, p := range s.pids {
		for alive(p.pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(p.pid) {
			t.Errorf("the %s (pid %d) still runs after %s", p.name, p.pid, what)
			if p.name != "PostgreSQL" {
				// Stuck in Go code: say where before it goes.
				dumpGoroutines(p.pid)
			}
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	if t.Failed() {
		t.Logf("dev stack output:\n%s", s.finalOutput(t))
	}
}

// TestSigtermToGoRunStopsEverything is `make run` stopped by a process
// manager rather than Ctrl-C: a SIGTERM to `go run` (which dies without
// passing it on) stops the dev stack, its forwarder and its PostgreSQL
// server; nothing is left running. A second stack started meanwhile on the
// same directory says that one is live instead of touching its PostgreSQL.
func TestSigtermToGoRunStopsEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	dir := t.TempDir()
	s := startStack(t, bin, dir)

	t.Run("ASecondStackSaysTheFirstIsLive", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		second := exec.CommandContext(ctx, "go", "run", "./cmd/devstack", "-data", dir, "-forwarder", bin, "-http-addr", "127.0.0.1:0")
		second.Dir = repoRoot
		got, err := second.CombinedOutput()
		if err == nil || !strings.Contains(string(got), "another dev stack is running in this directory") ||
			!strings.Contains(string(got), fmt.Sprintf("pid %d", s.pid("dev stack"))) {
			t.Errorf("second stack on a live directory: err %v, want it to name the live stack:\n%s", err, got)
		}
		if strings.Contains(string(got), "pg_ctl") {
			t.Errorf("the second stack advises stopping the live stack's PostgreSQL:\n%s", got)
		}
		if !alive(s.pid("PostgreSQL")) || !alive(s.pid("dev stack")) {
			t.Error("the second stack stopped the live one")
		}
	})

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.checkStopped(t, "SIGTERM to go run")
}

// TestSigintToMakeRunStopsEverythingWithoutAnError is `make run` stopped by
// a SIGINT to its whole process group: Ctrl-C without a terminal whose
// foreground the dev stack could take (a CI job's timeout, a process
// manager). make, the dev stack, its forwarder and its PostgreSQL server
// all get the signal; everything stops in order, the dev stack exits 0, and
// make reports no error: it ends as interrupted programs should, by the
// signal itself (or with status 0). Under `go run` (make run before it built
// the dev stack's binary) make reported "Error 1" and exited 2: go exits 1
// once interrupted, whatever the program it ran returned.
func TestSigintToMakeRunStopsEverythingWithoutAnError(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	dir := t.TempDir()
	cmd := makeRun(bin, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s := startStackWith(t, cmd, dir)
	if err := syscall.Kill(-s.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	state := s.endOfMakeRun(t, "SIGINT to make run's process group")
	byInterrupt := false
	if ws, ok := state.Sys().(syscall.WaitStatus); ok {
		byInterrupt = ws.Signaled() && ws.Signal() == syscall.SIGINT
	}
	if !state.Success() && !byInterrupt {
		t.Errorf("make run ended with %v after SIGINT, want status 0 or the SIGINT itself:\n%s", state, s.finalOutput(t))
	}
}

// endOfMakeRun waits for make run to end after what, checks that the stack
// stopped in order and that its output ends with the dev stack's summary and
// no error from make, and returns how make exited.
func (s *stack) endOfMakeRun(t *testing.T, what string) *os.ProcessState {
	t.Helper()
	state, err := s.cmd.Process.Wait()
	s.checkStopped(t, what)
	if err != nil {
		t.Fatal(err)
	}
	if out := s.finalOutput(t); !strings.Contains(out, "devstack: stopped.") || strings.Contains(out, "make: ***") {
		t.Errorf("want the dev stack's summary and no error from make:\n%s", out)
	}
	return state
}

// TestCtrlCInATerminalEndsMakeRunWithStatus0 is `make run` in a terminal
// and Ctrl-C, as a user types them: make runs in a terminal of its own (a
// pseudo-terminal whose foreground it is), the test types ^C, and the
// terminal sends SIGINT to its foreground process group. The dev stack has
// taken the foreground, so the signal reaches it alone: everything stops
// in order, it gives the terminal back, and make exits 0.
func TestCtrlCInATerminalEndsMakeRunWithStatus0(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	dir := t.TempDir()
	terminal, tty := openPty(t)
	cmd := makeRun(bin, dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// A session of its own whose controlling terminal is tty (fd 0 in the
	// child): its process group is the terminal's foreground, as a shell
	// makes a command it runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	s := startStackOn(t, cmd, terminal, dir)
	// The children hold the terminal now: the master side reads EOF once
	// they are all gone.
	_ = tty.Close()
	// ^C, as typed.
	if _, err := terminal.Write([]byte{0x03}); err != nil {
		t.Fatal(err)
	}
	if state := s.endOfMakeRun(t, "Ctrl-C in make run's terminal"); !state.Success() {
		t.Errorf("make run ended with %v after Ctrl-C, want status 0:\n%s", state, s.finalOutput(t))
	}
}

// makeRun is `make run` on the test's forwarder and data directory: deps
// and build (bin/forwarder) are taken as done (-o), and it runs without the
// flags of a make running this test (make test's -j3 and --output-sync), as
// a user types it.
func makeRun(bin, dir string) *exec.Cmd {
	cmd := exec.Command("make", "--no-print-directory", "-o", "deps", "-o", "build", "run",
		"ARGS="+strings.Join(stackFlags(bin, dir), " "))
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "MAKEFLAGS" && name != "MFLAGS" && name != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// openPty opens a pseudo-terminal: its master side (what a terminal
// emulator reads and types into) and its slave side (the terminal a
// program runs in). Both are closed at the end of the test.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = master.Close() })
	unlock := int32(0)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("unlocking the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("naming the pseudo-terminal: %v", errno)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slave.Close() })
	return master, slave
}

// TestABurstOfSigtermsStopsEverything is go run dying: the kernel sends the
// parent-death SIGTERM once per thread of go run as each exits, several
// within milliseconds. However they fall, the stack stops in order: none
// may find the signal back at its default action, which would kill the
// stack halfway and leave PostgreSQL running.
func TestABurstOfSigtermsStopsEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	s := startStack(t, bin, t.TempDir())
	pid := s.pid("dev stack")
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			break // gone: checkStopped says whether in order
		}
	}
	s.checkStopped(t, "a burst of SIGTERMs")
	if out := s.finalOutput(t); !strings.Contains(out, "devstack: stopped.") {
		t.Errorf("the dev stack did not say it stopped:\n%s", out)
	}
}

// TestReaderGoneStopsEverything is `make run | head`: once the reader of
// its output exits, the dev stack's next progress line meets a broken pipe.
// It stops in order as on Ctrl-C instead of dying of SIGPIPE with its
// PostgreSQL server left running, and so the next run on the same
// directory starts.
func TestReaderGoneStopsEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	dir := t.TempDir()
	for run := 1; run <= 2; run++ {
		s := startStack(t, bin, dir)
		if err := s.stdout.Close(); err != nil {
			t.Fatal(err)
		}
		s.checkStopped(t, "the reader of its output went away")
		if t.Failed() {
			return
		}
	}
}

// dumpGoroutines asks the Go process pid for its goroutines' stacks
// (SIGQUIT: the runtime prints them to its standard error, which is the dev
// stack's output this test shows, and exits) and gives it a few seconds to
// write them.
func dumpGoroutines(pid int) {
	if syscall.Kill(pid, syscall.SIGQUIT) != nil {
		return
	}
	for end := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
}
