package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/forwarder/forwarder/internal/plural"
)

const (
	sessionCookie = "forwarder_console"
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
	// maxSessions bounds the sessions kept; past it the oldest ends.
	maxSessions = 1000
	// maxOperatorLength bounds an operator's name (login form, basic-auth
	// user): it goes into the audit log.
	maxOperatorLength = 64
	// maxLoginBytes caps the login form's body, read before the token is
	// checked; maxFormBytes the other forms', read after.
	maxLoginBytes = 4 << 10
	maxFormBytes  = 64 << 10
	// Login attempts per client address: loginBurst at once, then one
	// every loginEvery.
	loginBurst = 10
	loginEvery = 6 * time.Second
	// maxLoginClients bounds the addresses tracked; past it, unknown
	// addresses share one allowance.
	maxLoginClients = 10000
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

// errNoCredentials: the request carries no valid token or session.
var errNoCredentials = errors.New("console: no valid token or session")

// authenticate returns who sent the request. Without a token configured
// everyone is the configured operator. With one, the request must carry it:
// as a bearer token (operator: the configured one), as the password of
// basic auth (operator: the user name, which must be a valid operator
// name), or through a session cookie from the login form (operator: the
// name given there).
func (s *Server) authenticate(r *http.Request) (string, error) {
	if s.cfg.Token == "" {
		return s.cfg.Operator, nil
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		// The scheme's name is case-insensitive (RFC 9110, "Authentication Scheme").
		if scheme, tok, _ := strings.Cut(auth, " "); strings.EqualFold(scheme, "Bearer") {
			if !s.tokenMatches(strings.TrimSpace(tok)) {
				return "", errNoCredentials
			}
			return s.cfg.Operator, nil
		}
		if user, pass, ok := r.BasicAuth(); ok {
			if !s.tokenMatches(pass) {
				return "", errNoCredentials
			}
			user = strings.TrimSpace(user)
			if user == "" {
				return s.cfg.Operator, nil
			}
			if !validOperator(user) {
				return "", httpError{http.StatusBadRequest, fmt.Sprintf(
					"console: the basic-auth user name is recorded as the operator: give up to %d printable characters", maxOperatorLength)}
			}
			return user, nil
		}
		return "", errNoCredentials
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		if op, ok := s.sessions.lookup(c.Value, time.Now()); ok {
			return op, nil
		}
	}
	return "", errNoCredentials
}

// validOperator says whether name may be recorded as an operator: 1 to
// maxOperatorLength bytes of printable UTF-8, so an audit row holds no
// newline, escape sequence or right-to-left override.
func validOperator(name string) bool {
	if name == "" || len(name) > maxOperatorLength || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
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

// sessions are the logins of this process: the cookie holds a random id,
// never the token, and the server keeps who it stands for, so logging out
// ends the session here and not only in the browser. A restart ends every
// session.
type sessions struct {
	mu   sync.Mutex
	byID map[string]session
}

type session struct {
	operator string
	expires  time.Time
}

// create starts a session for operator and returns its id (128 random
// bits).
func (ss *sessions) create(operator string, now time.Time) string {
	id := rand.Text()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.byID == nil {
		ss.byID = map[string]session{}
	}
	if len(ss.byID) >= maxSessions {
		oldest := ""
		for k, v := range ss.byID {
			if !now.Before(v.expires) {
				delete(ss.byID, k)
			} else if oldest == "" || v.expires.Before(ss.byID[oldest].expires) {
				oldest = k
			}
		}
		if len(ss.byID) >= maxSessions {
			delete(ss.byID, oldest)
		}
	}
	ss.byID[id] = session{operator: operator, expires: now.Add(sessionTTL)}
	return id
}

func (ss *sessions) lookup(id string, now time.Time) (string, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	v, ok := ss.byID[id]
	if !ok || !now.Before(v.expires) {
		return "", false
	}
	return v.operator, true
}

func (ss *sessions) revoke(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, id)
}

// loginLimiter allows each client address loginBurst login attempts at
// once and one more every loginEvery (a token bucket per address), so the
// login form can be neither guessed at speed nor used to flood the log.
// Behind a proxy every browser shares the proxy's address, and with it
// one allowance.
type loginLimiter struct {
	mu      sync.Mutex
	clients map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// allow takes one attempt for client, or says how long until there is one.
func (l *loginLimiter) allow(client string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients == nil {
		l.clients = map[string]*bucket{}
	}
	b, ok := l.clients[client]
	if !ok {
		// One place is kept for the shared allowance.
		full := func() bool { return len(l.clients) >= maxLoginClients-1 }
		if full() && now.Sub(l.swept) >= loginEvery {
			// Forget the addresses whose allowance is whole again (a new
			// bucket would be the same); at most once per loginEvery, so a
			// flood of new addresses costs no more than that.
			l.swept = now
			for k, v := range l.clients {
				if v.refill(now) >= loginBurst {
					delete(l.clients, k)
				}
			}
		}
		if full() {
			client = "(others)"
			b = l.clients[client]
		}
		if b == nil {
			b = &bucket{tokens: loginBurst, at: now}
			l.clients[client] = b
		}
	}
	if b.refill(now) < 1 {
		return false, time.Duration((1 - b.tokens) * float64(loginEvery))
	}
	b.tokens--
	return true, 0
}

func (b *bucket) refill(now time.Time) float64 {
	b.tokens = min(loginBurst, b.tokens+now.Sub(b.at).Seconds()/loginEvery.Seconds())
	b.at = now
	return b.tokens
}

// clientAddress is the peer's IP address, an IPv6 address by its /64 (what
// one host is usually given).
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// secureRequest says the browser reached the console over TLS: directly,
// or through a proxy that terminated it and says so (X-Forwarded-Proto:
// https, or Forwarded: proto=https). The session cookie is then Secure.
// The headers are believed from any peer: Secure only keeps a cookie off
// plain HTTP, so a client claiming HTTPS over plain HTTP only loses its own
// session. A TLS proxy must set the header (and overwrite one a client
// sent); docs/operations.md, "Console".
func secureRequest(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); strings.EqualFold(strings.TrimSpace(proto), "https") {
		return true
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for _, pair := range strings.Split(first, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(v, `"`), "https") {
			return true
		}
	}
	return false
}

// csrfToken is the hidden field every form that changes something carries:
// an HMAC of the operator under the process's secret, which a page of
// another site can neither read nor compute.
func (s *Server) csrfToken(operator string) string {
	return s.mac("csrf", operator)
}

// mac is the HMAC of value for purpose under the process's secret.
func (s *Server) mac(purpose, value string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(purpose + "\x00"))
	m.Write([]byte(value))
	return hex.EncodeToString(m.Sum(nil))
}

// flashQuery is the query of the page an action redirects to: the message
// that says what the action did, and its HMAC.
func (s *Server) flashQuery(msg string) string {
	return "done=" + url.QueryEscape(msg) + "&sig=" + s.mac("flash", msg)
}

// flashOf is the message of the request's query, shown at the top of the
// page only when this console signed it (flashQuery): a link made anywhere
// else cannot put its own words there ("the token changed: log in at ...",
// "Requeued 0 rows", on the login page or any other).
func (s *Server) flashOf(r *http.Request) string {
	q := r.URL.Query()
	msg := q.Get("done")
	if msg == "" || !hmac.Equal([]byte(q.Get("sig")), []byte(s.mac("flash", msg))) {
		return ""
	}
	return msg
}

// parseForm reads a POST's form, within the limit ServeHTTP set on the
// body; when it cannot, it answers (413 or 400) and returns false. Read
// before the CSRF check, so a form too large is not called stale.
func parseForm(w http.ResponseWriter, r *http.Request) bool {
	err := r.ParseForm()
	if err == nil {
		return true
	}
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		http.Error(w, fmt.Sprintf("console: a form is at most %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
		return false
	}
	http.Error(w, "console: the form does not parse", http.StatusBadRequest)
	return false
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
	// Before anything is read: the attempts of one address are limited.
	if ok, wait := s.logins.allow(clientAddress(r), time.Now()); !ok {
		secs := int(wait.Seconds()) + 1
		s.log.Warn("console login refused: too many attempts", "remote", r.RemoteAddr)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.render(w, r, http.StatusTooManyRequests, "login", loginData{Next: "/",
			Error: fmt.Sprintf("Too many login attempts from your address: try again in %s.", plural.Count(secs, "second", "seconds"))})
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/x-www-form-urlencoded" {
		http.Error(w, "console: log in with the login form (application/x-www-form-urlencoded)", http.StatusUnsupportedMediaType)
		return
	}
	if !parseForm(w, r) {
		return
	}
	name := strings.TrimSpace(r.PostForm.Get("name"))
	next := safeNext(r.PostForm.Get("next"))
	switch {
	case !validOperator(name):
		s.render(w, r, http.StatusBadRequest, "login", loginData{Next: next, Name: SafeLine(name),
			Error: fmt.Sprintf("Give your name (up to %d printable characters): it goes into the audit log with what you do.", maxOperatorLength)})
		return
	case !s.tokenMatches(r.PostForm.Get("token")):
		s.log.Warn("console login refused: wrong token", "name", name, "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", loginData{Next: next, Name: name, Error: "Wrong token."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.sessions.create(name, time.Now()), Path: "/",
		MaxAge: int(sessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secureRequest(r)})
	s.log.Info("console login", "operator", name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session on the server, so the cookie is worthless even
// where the browser keeps it.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if !parseForm(w, r) {
		return
	}
	if !s.checkCSRF(r) {
		http.Error(w, "console: the form is stale or came from elsewhere (CSRF check failed): reload the page", http.StatusForbidden)
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.revoke(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secureRequest(r)})
	s.log.Info("console logout", "operator", operatorOf(r), "remote", r.RemoteAddr)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this console: a path on this host,
// in printable ASCII, that no browser could read as another host. Browsers
// drop tabs and newlines from URLs and read "\" as "/", so "/\t/evil" and
// "/\\evil" mean //evil; a decoded path is checked too ("/%09/evil").
// Anything else goes to the overview.
func safeNext(next string) string {
	if next == "" || next[0] != '/' || len(next) > 2048 {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	if !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") ||
		strings.ContainsFunc(u.Path, func(c rune) bool { return c < ' ' || c == 0x7f || c == '\\' }) {
		return "/"
	}
	return next
}
