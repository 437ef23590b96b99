package tcpproxy

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo serves, on a free port, connections that send back each line.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line on c and reads it back.
func roundTrip(c net.Conn, r *bufio.Reader) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

func TestProxy(t *testing.T) {
	t.Parallel()
	p := New(t, echo(t), Options{ReplyDelay: time.Millisecond})
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	// Refusing: a new connection is hung up; the one carried goes on.
	p.Refuse(true)
	hung, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	if err := roundTrip(hung, bufio.NewReader(hung)); err == nil {
		t.Fatal("a connection made while refusing was answered")
	}
	if err := roundTrip(c, r); err != nil {
		t.Fatalf("the connection carried before refusing: %v", err)
	}
	if n := p.Dials(); n != 2 {
		t.Errorf("%d dials counted, want 2", n)
	}
	p.Refuse(false)

	// Cut: the connection carried ends, and the port is closed.
	p.Cut()
	if err := roundTrip(c, r); err == nil {
		t.Fatal("a connection carried across the cut was answered")
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Fatal("a connection was accepted after the cut")
	}
}
