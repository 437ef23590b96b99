package childproc

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

func sh(t *testing.T, script string, env map[string]string, environ []string) (*Process, *logbuf.Buffer) {
	t.Helper()
	out := &logbuf.Buffer{}
	p, err := Start(Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: t.TempDir(),
		Environ: environ, Env: env, Output: out, ParentDeath: syscall.SIGKILL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p, out
}

// Not parallel: it sets an environment variable of the test process.
func TestEnvWinsOverEnvironAndNothingElseLeaksIn(t *testing.T) {
	t.Setenv("CHILDPROC_PARENT_ONLY", "leaked") // not in Environ: must not reach the child
	p, out := sh(t, `echo "A=$A B=$B P=$CHILDPROC_PARENT_ONLY"`,
		map[string]string{"A": "env"}, []string{"A=environ", "B=environ"})
	<-p.Done()
	if got := strings.TrimSpace(out.String()); got != "A=env B=environ P=" {
		t.Errorf("child saw %q, want Env over Environ and nothing from the parent", got)
	}
	if p.Err() != nil || p.ExitCode() != 0 {
		t.Errorf("exit %d, %v; want 0", p.ExitCode(), p.Err())
	}
}

func TestProcess(t *testing.T) {
	t.Parallel()

	t.Run("ExitStatusIsReported", func(t *testing.T) {
		t.Parallel()
		p, _ := sh(t, "exit 3", nil, nil)
		<-p.Done()
		if p.ExitCode() != 3 || p.Err() == nil {
			t.Errorf("exit %d, %v; want 3 and an error", p.ExitCode(), p.Err())
		}
	})

	t.Run("StopSendsSIGTERMAndWaits", func(t *testing.T) {
		t.Parallel()
		p, out := sh(t, `trap 'echo stopping; exit 0' TERM; echo ready; while :; do sleep 0.05; done`, nil, nil)
		waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
		if p.ExitCode() != -1 || p.Err() != nil {
			t.Fatalf("a running child reports exit %d, %v", p.ExitCode(), p.Err())
		}
		if err := p.Stop(10 * time.Second); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if !strings.Contains(out.String(), "stopping") {
			t.Errorf("the child did not see SIGTERM; output %q", out.String())
		}
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("signalling an exited child: %v, want nil", err)
		}
	})

	t.Run("StopKillsAChildThatIgnoresSIGTERM", func(t *testing.T) {
		t.Parallel()
		p, out := sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, nil, nil)
		waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
		if err := p.Stop(200 * time.Millisecond); !errors.Is(err, ErrKilled) {
			t.Fatalf("stop: %v, want it killed", err)
		}
		if !p.Exited() {
			t.Error("the child is still running after Stop")
		}
	})

	t.Run("WaitPing", func(t *testing.T) {
		t.Parallel()
		p, _ := sh(t, "exec sleep 30", nil, nil)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		up := make(chan struct{})
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-up:
			default:
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		})}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { srv.Close() })

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := p.WaitPing(ctx, l.Addr().String()); err == nil {
			t.Fatal("WaitPing returned before /ping answered 200")
		}
		close(up)
		if err := p.WaitPing(context.Background(), l.Addr().String()); err != nil {
			t.Fatalf("WaitPing: %v", err)
		}

		// A child that exits first ends the wait with its exit.
		gone, _ := sh(t, "exit 7", nil, nil)
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if err := gone.WaitPing(context.Background(), addr); err == nil || !strings.Contains(err.Error(), "exited during start-up") {
			t.Fatalf("WaitPing on an exited child: %v", err)
		}
	})
}

func TestTailFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("first line\nsecond line\nthird\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := TailFile(path, 15); got != "third" {
		t.Errorf("TailFile(15) = %q, want the whole lines within the last 15 bytes", got)
	}
	if got := TailFile(path, 1000); got != "first line\nsecond line\nthird" {
		t.Errorf("TailFile(1000) = %q, want the whole file", got)
	}
	if got := TailFile(filepath.Join(t.TempDir(), "none"), 10); got != "" {
		t.Errorf("TailFile of a missing file = %q", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFreePort: the ports are free and outside the kernel's ephemeral
// range, where no connection's source port can take them before a server
// listens.
func TestFreePort(t *testing.T) {
	t.Parallel()
	first, last := ephemeralPorts()
	low, high := outsideEphemeralPorts(first, last)
	if high-low < minPorts {
		t.Fatalf("picking from [%d, %d): fewer than %d ports", low, high, minPorts)
	}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < low || port >= high {
			t.Fatalf("port %d outside [%d, %d)", port, low, high)
		}
		// (Only a machine whose ephemeral range leaves no room on either
		// side, where FreePort picks from every unprivileged port, may.)
		if port >= first && port <= last && low != 1024 {
			t.Fatalf("port %d is in the ephemeral range %d-%d", port, first, last)
		}
		if !PortFree(port) {
			t.Fatalf("port %d is not free", port)
		}
	}
}

// TestOutsideEphemeralPorts: the range FreePort picks from, for ephemeral
// ranges a machine may be configured with.
func TestOutsideEphemeralPorts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		first, last, low, high int
	}{
		{32768, 60999, 20000, 32768}, // Linux's default: below it
		{49152, 65535, 20000, 49152}, // IANA's range
		{20500, 40000, 40001, 65536}, // too little room below: above it
		{1024, 60000, 60001, 65536},
		{10000, 50000, 50001, 65536},
		{15000, 19999, 20000, 65536}, // wholly below 20000: from 20000 up
		{1024, 65000, 1024, 65536},   // no room on either side: any port
		{1024, 65535, 1024, 65536},
	} {
		low, high := outsideEphemeralPorts(c.first, c.last)
		if low != c.low || high != c.high {
			t.Errorf("ephemeral %d-%d: picking from [%d, %d), want [%d, %d)", c.first, c.last, low, high, c.low, c.high)
		}
	}
}
