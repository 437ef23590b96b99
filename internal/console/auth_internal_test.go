package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestSafeNext: a redirect target after login stays on this console,
// whatever a browser makes of it.
func TestSafeNext(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"/":                             "/",
		"/search?plate=%E7%B2%A4B12345": "/search?plate=%E7%B2%A4B12345",
		"/records/5":                    "/records/5",
		"/failed/requeue?reason=a//b":   "/failed/requeue?reason=a//b",
		"":                              "/",
		"//evil.example":                "/",
		"///evil.example":               "/",
		"/\\evil.example":               "/",
		"/\t/evil.example":              "/",
		"/\n/evil.example":              "/",
		"/\r\n/evil.example":            "/",
		"/ /evil.example":               "/",
		"/%09/evil.example":             "/",
		"/%2F/evil.example":             "/",
		"/%2f%2fevil.example":           "/",
		"/%5Cevil.example":              "/",
		"/%0d%0aSet-Cookie:x=1":         "/",
		"https://evil.example/":         "/",
		"http:/evil.example":            "/",
		"javascript:alert(1)":           "/",
		"evil.example":                  "/",
		"/\u2028/evil.example":          "/",
		"/\x7f/evil.example":            "/",
		"/ok\\":                         "/",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

// TestLoginLimiter: each address gets loginBurst attempts, then one per
// loginEvery; other addresses are not held back; the addresses tracked
// are bounded.
func TestLoginLimiter(t *testing.T) {
	t.Parallel()
	var l loginLimiter
	now := time.Unix(1_800_000_000, 0)
	for i := range loginBurst {
		if ok, _ := l.allow("10.0.0.1", now); !ok {
			t.Fatalf("attempt %d refused", i+1)
		}
	}
	ok, wait := l.allow("10.0.0.1", now)
	if ok || wait <= 0 || wait > loginEvery {
		t.Fatalf("attempt %d: allowed %v, wait %v; want refused, wait at most %v", loginBurst+1, ok, wait, loginEvery)
	}
	if ok, _ := l.allow("10.0.0.2", now); !ok {
		t.Error("another address is held back")
	}
	if ok, _ := l.allow("10.0.0.1", now.Add(loginEvery)); !ok {
		t.Error("no attempt after loginEvery")
	}
	if ok, _ := l.allow("10.0.0.1", now.Add(loginEvery)); ok {
		t.Error("two attempts after one loginEvery")
	}
	for i := range 2 * maxLoginClients {
		l.allow(string(rune(0x10000+i)), now)
	}
	if n := len(l.clients); n > maxLoginClients {
		t.Errorf("%d addresses tracked, want at most %d", n, maxLoginClients)
	}
}

func TestClientAddress(t *testing.T) {
	t.Parallel()
	for remote, want := range map[string]string{
		"192.0.2.7:51234":            "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"not an address":             "not an address",
	} {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = remote
		if got := clientAddress(r); got != want {
			t.Errorf("clientAddress(%q) = %q, want %q", remote, got, want)
		}
	}
}

// TestSessionsAreBounded: past maxSessions, the session ending soonest
// goes first; an expired one never counts.
func TestSessionsAreBounded(t *testing.T) {
	t.Parallel()
	var ss sessions
	now := time.Unix(1_800_000_000, 0)
	first := ss.create("first", now)
	for i := range maxSessions {
		ss.create("op", now.Add(time.Duration(i+1)*time.Second))
	}
	if len(ss.byID) != maxSessions {
		t.Errorf("%d sessions kept, want %d", len(ss.byID), maxSessions)
	}
	if _, ok := ss.lookup(first, now); ok {
		t.Error("the oldest session survived")
	}
	id := ss.create("x", now)
	if op, ok := ss.lookup(id, now.Add(sessionTTL-time.Second)); !ok || op != "x" {
		t.Errorf("a live session: %q, %v", op, ok)
	}
	if _, ok := ss.lookup(id, now.Add(sessionTTL)); ok {
		t.Error("an expired session still works")
	}
}

// TestPublicError: what a page says of a database error names the timeout
// to change or the server's refusal, never the driver's connection text.
func TestPublicError(t *testing.T) {
	t.Parallel()
	s := &Server{cfg: Config{StatementTimeout: 2 * time.Second}}
	for _, c := range []struct {
		err    error
		status int
		says   string
	}{
		{fmt.Errorf("finding rows: %w", &pgconn.PgError{Code: queryCanceled, Message: "canceling statement due to statement timeout"}),
			http.StatusServiceUnavailable, "each statement 2s, a request 6s; --timeout"},
		{fmt.Errorf("counting: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, "took longer than the console waits"},
		{&pgconn.PgError{Code: "42501", Message: "permission denied for table forward_messages"},
			http.StatusInternalServerError, "The database refused the request: permission denied for table forward_messages"},
		{errors.New("failed to connect to `user=billing host=10.0.0.7`"), http.StatusServiceUnavailable, "its log has the driver's error"},
	} {
		status, msg := s.publicError(c.err)
		if status != c.status || !strings.Contains(msg, c.says) || strings.Contains(msg, "billing") {
			t.Errorf("publicError(%v) = %d %q, want %d saying %q", c.err, status, msg, c.status, c.says)
		}
	}
}
