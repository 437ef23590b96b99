// Package tcpproxy is a TCP proxy for tests that break the link between a
// client and its server on purpose, where the server itself must stay up:
// hang up new connections as a server that is down does, hold the server's
// replies as a slow link does, or cut the link (every connection closed,
// new ones refused) as a failed network does.
//
//	p := tcpproxy.New(t, "127.0.0.1:5432", tcpproxy.Options{})
//	dsn := "postgres://…@" + p.Addr() + "/…"
//	...
//	p.Cut()
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Options shape the link.
type Options struct {
	// ReplyDelay holds each chunk the server sends for that long before
	// passing it on (0: none).
	ReplyDelay time.Duration
	// Refusing starts the proxy hanging up new connections (see Refuse).
	Refusing bool
}

// Proxy forwards each connection to its target until cut; it is cut at the
// end of the test that made it.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	refuse atomic.Bool
	dials  atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	wg    sync.WaitGroup
}

// New listens on a free port of 127.0.0.1 and forwards to target
// (host:port).
func New(t testing.TB, target string, o Options) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy to %s: %v", target, err)
	}
	p := &Proxy{ln: ln, target: target, delay: o.ReplyDelay, conns: map[net.Conn]struct{}{}}
	p.refuse.Store(o.Refusing)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Cut)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Refuse makes the proxy accept new connections and hang up at once (true),
// as a server that is down does, or forward them again (false). The
// connections it carries are left as they are.
func (p *Proxy) Refuse(refuse bool) { p.refuse.Store(refuse) }

// Dials counts the connections accepted so far, hung up or forwarded.
func (p *Proxy) Dials() int64 { return p.dials.Load() }

// Cut closes every connection the proxy carries and its port: new
// connections are refused.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		return
	}
	p.cut = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.dials.Add(1)
		if p.refuse.Load() {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, c, 0)
		go p.pipe(c, up, p.delay)
	}
}

// track keeps c and up to close at the cut; false (both closed) once cut.
func (p *Proxy) track(c, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		_ = c.Close()
		_ = up.Close()
		return false
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, each chunk held for delay, and closes both when
// either side ends.
func (p *Proxy) pipe(dst, src net.Conn, delay time.Duration) {
	defer p.wg.Done()
	if delay <= 0 {
		_, _ = io.Copy(dst, src)
	} else {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				time.Sleep(delay)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
