package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

// goRunDevstack starts `go run ./cmd/devstack` as `make run` does, on data
// directory dir.
func goRunDevstack(t *testing.T, bin, dir string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command("go", "run", "./cmd/devstack", "-data", dir, "-forwarder", bin, "-http-addr", "127.0.0.1:0", "-rate", "20")
	cmd.Dir = repoRoot
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(stdout)
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
	cmd, lines := goRunDevstack(t, bin, dir)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	var (
		mu  sync.Mutex
		out strings.Builder
	)
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	fwdPid := 0
	pidLine := regexp.MustCompile(`forwarder running \(pid (\d+)\)`)
	ready := make(chan error, 1)
	go func() {
		up := false
		for lines.Scan() {
			line := lines.Text()
			mu.Lock()
			out.WriteString(line + "\n")
			mu.Unlock()
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
			t.Fatalf("%v:\n%s", err, output())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the dev stack did not come up in 3 minutes:\n%s", output())
	}
	stackPid := readPid(t, filepath.Join(dir, "devstack.lock"))
	pgPid := readPid(t, filepath.Join(dir, "pg", "postmaster.pid"))
	for name, pid := range map[string]int{"dev stack": stackPid, "forwarder": fwdPid, "PostgreSQL": pgPid} {
		if pid == 0 || !alive(pid) {
			t.Fatalf("the %s (pid %d) is not running:\n%s", name, pid, output())
		}
	}

	t.Run("ASecondStackSaysTheFirstIsLive", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		second := exec.CommandContext(ctx, "go", "run", "./cmd/devstack", "-data", dir, "-forwarder", bin, "-http-addr", "127.0.0.1:0")
		second.Dir = repoRoot
		got, err := second.CombinedOutput()
		if err == nil || !strings.Contains(string(got), "another dev stack is running in this directory") ||
			!strings.Contains(string(got), fmt.Sprintf("pid %d", stackPid)) {
			t.Errorf("second stack on a live directory: err %v, want it to name the live stack:\n%s", err, got)
		}
		if strings.Contains(string(got), "pg_ctl") {
			t.Errorf("the second stack advises stopping the live stack's PostgreSQL:\n%s", got)
		}
		if !alive(pgPid) || !alive(stackPid) {
			t.Error("the second stack stopped the live one")
		}
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The stack's own bounds: 40 s for the forwarder, 60 s for pg_ctl stop.
	deadline := time.Now().Add(150 * time.Second)
	for _, p := range []struct {
		name string
		pid  int
	}{{"forwarder", fwdPid}, {"PostgreSQL", pgPid}, {"dev stack", stackPid}} {
		for alive(p.pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(p.pid) {
			t.Errorf("the %s (pid %d) still runs after SIGTERM to go run", p.name, p.pid)
			if p.name != "PostgreSQL" {
				// Stuck in Go code: say where before it goes.
				dumpGoroutines(p.pid)
			}
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	if t.Failed() {
		t.Logf("dev stack output:\n%s", output())
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
