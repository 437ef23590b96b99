// Package console is the operator's web console (`forwarder outbox
// console`): an overview of the outbox, FAILED rows grouped by reason, a
// search by plate, park, berth, device, status, errcode and time, a page per
// row (payload, the request the current mapping would send, attempts), and
// requeue actions with a confirmation step and an audit row.
//
// Pages are rendered on the server (html/template) from templates and a
// style sheet embedded in the binary; there is no JavaScript build. Every
// query runs in a read-only transaction with a statement timeout
// (outboxdb.ReadOnly) or is an index walk with a row limit.
//
// Security model (docs/operations.md, "Console"): listening on anything but
// a loopback address requires a token (CONSOLE_TOKEN), which every request
// must then carry (Authorization: Bearer or Basic with the token as the
// password, or the session cookie the login form sets). Without a token the
// console is open to whoever can reach the loopback address, that is to
// local users, and it then only answers requests whose Host is an IP address
// or localhost (a web page cannot reach it through DNS rebinding). Every
// change is a POST carrying a CSRF token, after a GET that shows what will
// change.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults.
const (
	// DefaultAddr is where the console listens: loopback only.
	DefaultAddr = "127.0.0.1:4196"
	// MinTokenLength is the shortest CONSOLE_TOKEN accepted: 32
	// characters are 128 bits in hex (openssl rand -hex 16).
	MinTokenLength = 32
	// minTokenSymbols is the fewest different characters a CONSOLE_TOKEN
	// may use: a random one of 32 hex digits has about 14.
	minTokenSymbols = 8
	// shutdownGrace is how long requests in progress may take to finish
	// after SIGINT or SIGTERM.
	shutdownGrace = 10 * time.Second
	// groupLimit caps the FAILED groups listed.
	groupLimit = 100
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a console.
type Config struct {
	// Addr is host:port to listen on (CONSOLE_ADDR).
	Addr string
	// Token, when set, must accompany every request (CONSOLE_TOKEN). It is
	// required when Addr is not a loopback address.
	Token string
	// ReadOnly hides the actions and refuses them.
	ReadOnly bool
	// Operator names whoever acts through a request that carries no user
	// name (no token configured, or a bearer token): --operator or $USER.
	Operator string
	// MappingsDir holds the mapping files (<api_type>.blobl) for the
	// request preview.
	MappingsDir string
	// StatementTimeout bounds every query (outboxdb.DefaultLookupTimeout
	// when 0).
	StatementTimeout time.Duration
	// Logger receives one line per action and per server error; nil: none.
	Logger *slog.Logger
}

// Server is a console: an http.Handler over one database pool.
type Server struct {
	cfg      Config
	pool     *pgxpool.Pool
	pages    map[string]*template.Template
	secret   []byte
	log      *slog.Logger
	mux      *http.ServeMux
	sessions sessions
	logins   loginLimiter
}

// CheckAddr refuses a listen address that is not loopback when no token is
// set, naming the variable to set.
func CheckAddr(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("CONSOLE_ADDR %q: want host:port (e.g. %s): %v", addr, DefaultAddr, err)
	}
	if token != "" {
		if len(token) < MinTokenLength {
			unit := "characters"
			if len(token) == 1 {
				unit = "character"
			}
			return fmt.Errorf("CONSOLE_TOKEN is %d %s long: use at least %d (a random one: openssl rand -hex 24)", len(token), unit, MinTokenLength)
		}
		if n := symbols(token); n < minTokenSymbols {
			return fmt.Errorf("CONSOLE_TOKEN uses %d different characters: use a random token of at least %d characters (openssl rand -hex 24)", n, MinTokenLength)
		}
		return nil
	}
	if !isLoopbackHost(host) {
		return fmt.Errorf("CONSOLE_ADDR %s is not a loopback address: set CONSOLE_TOKEN (a secret of at least %d characters that every request must carry) or listen on 127.0.0.1", addr, MinTokenLength)
	}
	return nil
}

// symbols counts the different bytes of s.
func symbols(s string) int {
	var seen [256]bool
	n := 0
	for i := 0; i < len(s); i++ {
		if !seen[s[i]] {
			seen[s[i]] = true
			n++
		}
	}
	return n
}

// isLoopbackHost: "localhost" or a loopback IP. An empty host (all
// interfaces) or any other name is not.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// New builds a console over pool. It checks cfg but does not listen.
func New(cfg Config, pool *pgxpool.Pool) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if err := CheckAddr(cfg.Addr, cfg.Token); err != nil {
		return nil, err
	}
	if cfg.Operator == "" {
		return nil, errors.New("console: no operator name for requests without a user (set --operator)")
	}
	if cfg.MappingsDir == "" {
		cfg.MappingsDir = "mappings"
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	// Signs CSRF tokens; a restart draws a new one (and ends every session).
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, pool: pool, pages: pages, secret: secret, log: log, mux: http.NewServeMux()}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	static, _ := fs.Sub(staticFS, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /login", s.loginForm)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	s.mux.Handle("GET /{$}", s.page(s.overview))
	s.mux.Handle("GET /failed", s.page(s.failed))
	s.mux.Handle("GET /search", s.page(s.search))
	s.mux.Handle("GET /records/{id}", s.page(s.record))
	s.mux.Handle("GET /records/{id}/requeue", s.page(s.confirmRequeueRow))
	s.mux.Handle("POST /records/{id}/requeue", s.action(s.requeueRow))
	s.mux.Handle("GET /failed/requeue", s.page(s.confirmRequeueGroup))
	s.mux.Handle("POST /failed/requeue", s.action(s.requeueGroup))
	s.mux.Handle("POST /delivery/pause", s.action(s.pauseDelivery))
	s.mux.Handle("POST /delivery/resume", s.action(s.resumeDelivery))
}

// ServeHTTP applies the headers every answer gets, the Host check, and
// authentication, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	// Not no-referrer: with that policy browsers send "Origin: null" on the
	// console's own form posts, which the CSRF check refuses. same-origin
	// still keeps URLs (which hold plates in a search) from other sites.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	// Pages hold personal data (plates): never kept by a browser or proxy.
	h.Set("Cache-Control", "no-store")
	if s.cfg.Token == "" && !hostIsAddress(r.Host) {
		http.Error(w, "console: the Host header must be an IP address or localhost", http.StatusMisdirectedRequest)
		return
	}
	if !fetchAllowed(r) {
		http.Error(w, "console: another site's page may only link to the console, not fetch from it", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodPost {
		// The login form is read before the token is checked: a few KiB.
		limit := int64(maxFormBytes)
		if r.URL.Path == "/login" {
			limit = maxLoginBytes
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	if strings.HasPrefix(r.URL.Path, "/static/") || r.URL.Path == "/login" {
		s.mux.ServeHTTP(w, r)
		return
	}
	op, err := s.authenticate(r)
	if he, ok := errors.AsType[httpError](err); ok {
		http.Error(w, he.msg, he.status)
		return
	}
	if err != nil {
		s.refuse(w, r)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), operatorKey{}, op)))
}

// fetchAllowed applies the browser's Fetch Metadata: a request another
// site's page made the browser send (an image, a script's fetch, a frame)
// is refused, so a page visited elsewhere cannot make a console without a
// token run its lookups and counts. A link followed from elsewhere (a
// top-level navigation) still opens the console, and clients that send no
// such headers (curl, scripts) are not concerned.
func fetchAllowed(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return true
	}
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document"
}

// hostIsAddress: the request's Host is an IP literal or localhost, as a
// browser sends it for http://127.0.0.1:4196/, never a name that could be
// made to resolve to this machine by someone else's DNS.
func hostIsAddress(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return host == "localhost" || net.ParseIP(host) != nil
}

// Run listens on cfg.Addr and serves until ctx is done, then lets requests
// in progress finish (up to 10 s). ready, when not nil, receives the
// address actually listened on (useful with port 0).
func (s *Server) Run(ctx context.Context, ready func(addr string)) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("console: listening on %s: %w", s.cfg.Addr, err)
	}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// net/http's own messages (a handler's panic, an accept error)
		// are lines of the console's log, not of the standard logger.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError),
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("console: stopping: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
