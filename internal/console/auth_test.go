package console_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/console"
)

// TestLogin: the ways into the console with a token and what each refuses.
func TestLogin(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("NextStaysOnTheConsole", func(t *testing.T) {
		t.Parallel()
		c := b.start(t, console.Config{Token: testToken})
		for _, next := range []string{"/\t/evil.example", "/%09/evil.example", "/\\evil.example", "//evil.example", "https://evil.example"} {
			code, h, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {next}}, nil)
			if code != http.StatusSeeOther || h.Get("Location") != "/" {
				t.Errorf("login with next %q: %d to %q, want / (never another site)", next, code, h.Get("Location"))
			}
		}
		if _, _, page := c.do("GET", "/login?next="+url.QueryEscape("/\t/evil.example"), nil, nil); !strings.Contains(page, `name="next" value="/"`) {
			t.Errorf("the login form keeps a hostile next:\n%s", page)
		}
		code, h, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"/search?plate=x"}}, nil)
		if code != http.StatusSeeOther || h.Get("Location") != "/search?plate=x" {
			t.Errorf("login with a path of the console: %d to %q", code, h.Get("Location"))
		}
	})

	t.Run("BasicAuthUserNames", func(t *testing.T) {
		t.Parallel()
		c := b.start(t, console.Config{Token: testToken})
		for _, user := range []string{"erin\nforged audit line", strings.Repeat("e", 65), "\x1b]52;c;ZXZpbA==\x07", "\u202eevil", "bad\xffutf8"} {
			c.auth = "Basic " + basic(user, testToken)
			if code, _, body := c.do("GET", "/", nil, nil); code != http.StatusBadRequest || !strings.Contains(body, "up to 64 printable characters") {
				t.Errorf("basic-auth user %q: %d %.200q, want 400", user, code, body)
			}
			c.auth = "Basic " + basic(user, "wrong-token")
			if code, _, _ := c.do("GET", "/", nil, nil); code != http.StatusUnauthorized {
				t.Errorf("basic-auth user %q with a wrong token: %d, want 401", user, code)
			}
		}
		c.auth = "Basic " + basic(strings.Repeat("e", 64), testToken)
		if code, _, _ := c.do("GET", "/", nil, nil); code != http.StatusOK {
			t.Errorf("a 64-character user: %d", code)
		}
	})

	t.Run("LoginBodyIsBounded", func(t *testing.T) {
		t.Parallel()
		c := b.start(t, console.Config{Token: testToken})
		big := url.Values{"name": {"alice"}, "token": {testToken}, "pad": {strings.Repeat("x", 1<<20)}}
		if code, _, _ := c.do("POST", "/login", big, nil); code != http.StatusRequestEntityTooLarge {
			t.Errorf("a 1 MiB login form: %d, want 413", code)
		}
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		_ = mw.WriteField("name", "alice")
		_ = mw.WriteField("token", testToken)
		_ = mw.Close()
		req, _ := http.NewRequest("POST", c.base+"/login", &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("a multipart login: %d, want 415", resp.StatusCode)
		}
	})

	t.Run("LogoutEndsTheSession", func(t *testing.T) {
		t.Parallel()
		c := b.start(t, console.Config{Token: testToken})
		_, h, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {testToken}}, nil)
		cookie := sessionCookieOf(t, h)
		overview := c.get("/")
		if code, _, _ := c.do("POST", "/logout", url.Values{"csrf": {csrfOf(t, overview)}}, nil); code != http.StatusSeeOther {
			t.Fatalf("logout: %d", code)
		}
		// The browser dropped the cookie; someone who kept a copy is
		// refused all the same.
		c.hc.Jar = nil
		if code, _, body := c.do("GET", "/", nil, map[string]string{"Cookie": "forwarder_console=" + cookie}); code != http.StatusUnauthorized || strings.Contains(body, "Rows by status") {
			t.Errorf("the session's cookie after logout: %d, want 401", code)
		}
	})

	t.Run("SecureCookieBehindTLS", func(t *testing.T) {
		t.Parallel()
		c := b.start(t, console.Config{Token: testToken})
		for header, secure := range map[string]bool{
			"":                                     false,
			"X-Forwarded-Proto: http":              false,
			"X-Forwarded-Proto: https":             true,
			"X-Forwarded-Proto: HTTPS, http":       true,
			"Forwarded: for=192.0.2.1;proto=https": true,
			"Forwarded: proto=http":                false,
		} {
			hdr := map[string]string{}
			if k, v, ok := strings.Cut(header, ": "); ok {
				hdr[k] = v
			}
			_, h, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {testToken}}, hdr)
			if got := strings.Contains(h.Get("Set-Cookie"), "; Secure"); got != secure {
				t.Errorf("login with %q: cookie %q, Secure %v, want %v", header, h.Get("Set-Cookie"), got, secure)
			}
		}
	})
}

// TestLoginRateLimit: an address gets 10 login attempts, then one every 6
// s; the others are not held back. Run on the handler, to set the address.
func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := console.New(console.Config{Addr: "127.0.0.1:0", Token: testToken, Operator: "x"}, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	login := func(remote, token string) *httptest.ResponseRecorder {
		form := url.Values{"name": {"alice"}, "token": {token}}.Encode()
		r := httptest.NewRequest("POST", "http://127.0.0.1/login", strings.NewReader(form))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}
	for i := range 10 {
		if w := login("192.0.2.1:1000", fmt.Sprintf("guess-%02d-guess-%02d-guess-%02d-guess", i, i, i)); w.Code != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d, want 401", i+1, w.Code)
		}
	}
	w := login("192.0.2.1:1001", testToken)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || strings.Contains(w.Header().Get("Set-Cookie"), "forwarder_console=") ||
		!strings.Contains(w.Body.String(), "Too many login attempts") {
		t.Errorf("attempt 11, with the right token: %d, Retry-After %q, cookie %q; want 429 and no session", w.Code, w.Header().Get("Retry-After"), w.Header().Get("Set-Cookie"))
	}
	// The page says the wait the header gives, "1 second" in the singular.
	wait := w.Header().Get("Retry-After") + " seconds."
	if wait == "1 seconds." {
		wait = "1 second."
	}
	if !strings.Contains(w.Body.String(), "try again in "+wait) {
		t.Errorf("attempt 11: the page does not say %q:\n%s", "try again in "+wait, w.Body.String())
	}
	if w := login("198.51.100.9:1000", testToken); w.Code != http.StatusSeeOther {
		t.Errorf("another address: %d, want 303", w.Code)
	}
}

// sessionCookieOf is the session cookie's value set by a login.
func sessionCookieOf(t *testing.T, h http.Header) string {
	t.Helper()
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == "forwarder_console" && c.Value != "" {
			if strings.Contains(c.Value, testToken) {
				t.Errorf("the session cookie holds the token")
			}
			return c.Value
		}
	}
	t.Fatalf("no session cookie in %v", h)
	return ""
}

// TestBearerSchemeInAnyCase: "bearer" and "BEARER" are the same scheme
// (HTTP's authentication schemes are case-insensitive); a wrong token is
// still refused whatever the case.
func TestBearerSchemeInAnyCase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.start(t, console.Config{Token: testToken})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		c.auth = scheme + " " + testToken
		if code, _, body := c.do("GET", "/", nil, nil); code != http.StatusOK {
			t.Errorf("%s with the token: %d\n%s", scheme, code, body)
		}
		c.auth = scheme + " not-the-token"
		if code, _, _ := c.do("GET", "/", nil, nil); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", scheme, code)
		}
	}
}

// TestOtherSitesMayLinkButNotFetch: a page of another site can make a
// browser load an image or run a fetch from the console without a token
// (it listens on loopback); those are refused before any query runs. A
// link followed from elsewhere (an alert, a wiki) still opens the page,
// and a client that sends no Fetch Metadata (curl) is not concerned.
func TestOtherSitesMayLinkButNotFetch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.start(t, console.Config{})
	for _, r := range []struct {
		what   string
		header map[string]string
		want   int
	}{
		{"an <img> on another site", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, http.StatusForbidden},
		{"a fetch from another port of this host", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, http.StatusForbidden},
		{"a frame on another site", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, http.StatusForbidden},
		{"a link followed from another site", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, http.StatusOK},
		{"the console's own page", map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, http.StatusOK},
		{"an address typed in", map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, http.StatusOK},
		{"curl", nil, http.StatusOK},
	} {
		if code, _, body := c.do("GET", "/failed/requeue?class=TRANSIENT&reason=boom", nil, r.header); code != r.want {
			t.Errorf("%s: %d, want %d\n%s", r.what, code, r.want, body)
		}
	}
}
