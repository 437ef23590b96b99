package main_test

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAClosedConnectionDoesNotStopTheStack: the dev stack catches SIGPIPE
// so that a write to its closed output fails instead of killing it. Once
// caught, the signal is raised by a write to any closed connection of the
// process too: here its mock platform answering pipelined requests from a
// client that has hung up (its Kafka broker writing to a client that has
// gone is the same kind of write). The stack runs on (it stopped on the
// first such write before), and stops in order on SIGTERM.
func TestAClosedConnectionDoesNotStopTheStack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole dev stack")
	}
	bin := forwarderBin(t)
	s := startStack(t, bin, t.TempDir())
	m := regexp.MustCompile(`mock platform on http://(127\.0\.0\.1:\d+)`).FindStringSubmatch(s.output())
	if m == nil {
		t.Fatalf("no mock platform address in the dev stack's output:\n%s", s.output())
	}
	// Twenty requests in one write, then the connection closed unread: the
	// first reply draws a reset, and the next write meets a broken pipe.
	requests := strings.Repeat(fmt.Sprintf("GET /no-such-path HTTP/1.1\r\nHost: %s\r\n\r\n", m[1]), 20)
	for range 5 {
		c, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(requests)); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		time.Sleep(100 * time.Millisecond)
	}
	// Progress lines keep coming: three more within five seconds.
	before := strings.Count(s.output(), "\n")
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(s.output(), "\n") < before+3 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	out := s.output()
	if strings.Count(out, "\n") < before+3 || strings.Contains(out, "devstack: stopping") {
		t.Errorf("the dev stack stopped printing or stopped after a client hung up on its mock platform:\n%s", out)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.checkStopped(t, "SIGTERM to go run")
}
