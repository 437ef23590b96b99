package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	sessionCookie = "forwarder_console"
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
	// maxOperatorLength bounds the name typed into the login form.
	maxOperatorLength = 64
)

type operatorKey struct{}

// operatorOf is the authenticated operator of a request.
func operatorOf(r *http.Request) string {
	op, _ := r.Context().Value(operatorKey{}).(string)
	return op
}

// tokenMatches compares a presented token with the configured one in
// constant time (over their hashes, so the length leaks nothing either).
func (s *Server) tokenMatches(presented string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// authenticate returns who sent the request. Without a token configured
// everyone is the configured operator. With one, the request must carry it:
// as a bearer token (operator: the configured one), as the password of
// basic auth (operator: the user name), or through a session cookie from the
// login form (operator: the name given there).
func (s *Server) authenticate(r *http.Request) (string, bool) {
	if s.cfg.Token == "" {
		return s.cfg.Operator, true
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		if tok, ok := strings.CutPrefix(auth, "Bearer "); ok {
			return s.cfg.Operator, s.tokenMatches(strings.TrimSpace(tok))
		}
		if user, pass, ok := r.BasicAuth(); ok {
			user = strings.TrimSpace(user)
			if user == "" {
				user = s.cfg.Operator
			}
			return user, s.tokenMatches(pass)
		}
		return "", false
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return s.verifySession(c.Value, time.Now())
	}
	return "", false
}

// refuse answers an unauthenticated request: a browser asking for a page is
// sent to the login form, anything else gets 401.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="forwarder console"`)
	http.Error(w, "console: this request needs the console token (Authorization: Bearer <CONSOLE_TOKEN>)", http.StatusUnauthorized)
}

// sessionKey signs sessions: it depends on the token, so changing
// CONSOLE_TOKEN (and restarting) ends every session.
func (s *Server) sessionKey() []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("session\x00"))
	m.Write([]byte(s.cfg.Token))
	return m.Sum(nil)
}

// newSession is "<operator, base64>.<expiry unix>.<hmac>": the token itself
// is never in the cookie.
func (s *Server) newSession(operator string, now time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString([]byte(operator)) + "." + strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	m := hmac.New(sha256.New, s.sessionKey())
	m.Write([]byte(payload))
	return payload + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (s *Server) verifySession(v string, now time.Time) (string, bool) {
	i := strings.LastIndexByte(v, '.')
	if i < 0 {
		return "", false
	}
	payload, sig := v[:i], v[i+1:]
	m := hmac.New(sha256.New, s.sessionKey())
	m.Write([]byte(payload))
	want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return "", false
	}
	name, exp, ok := strings.Cut(payload, ".")
	if !ok {
		return "", false
	}
	expiry, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || now.Unix() > expiry {
		return "", false
	}
	op, err := base64.RawURLEncoding.DecodeString(name)
	if err != nil || len(op) == 0 {
		return "", false
	}
	return string(op), true
}

// csrfToken is the hidden field every form that changes something carries:
// an HMAC of the operator under the process's secret, which a page of
// another site can neither read nor compute.
func (s *Server) csrfToken(operator string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("csrf\x00"))
	m.Write([]byte(operator))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF accepts a POST only with the right token and, when the browser
// says where the form came from, only from this console.
func (s *Server) checkCSRF(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	got := r.PostFormValue("csrf")
	return hmac.Equal([]byte(got), []byte(s.csrfToken(operatorOf(r))))
}

type loginData struct {
	Next, Error, Name string
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	next := safeNext(r.PostFormValue("next"))
	switch {
	case name == "" || len(name) > maxOperatorLength || strings.ContainsFunc(name, func(c rune) bool { return c < ' ' }):
		s.render(w, r, http.StatusBadRequest, "login", loginData{Next: next, Name: name,
			Error: "Give your name (up to 64 characters): it goes into the audit log with what you do."})
		return
	case !s.tokenMatches(r.PostFormValue("token")):
		s.log.Warn("console login refused: wrong token", "name", name, "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", loginData{Next: next, Name: name, Error: "Wrong token."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.newSession(name, time.Now()), Path: "/",
		MaxAge: int(sessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	s.log.Info("console login", "operator", name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if !s.checkCSRF(r) {
		http.Error(w, "console: the form is stale or came from elsewhere (CSRF check failed): reload the page", http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	return next
}
