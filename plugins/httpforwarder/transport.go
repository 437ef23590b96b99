package httpforwarder

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/tracectx"
)

const (
	// maxResponseBytes of a reply are read and classified; a longer reply is
	// not parsed (body is nil).
	maxResponseBytes = 64 << 10
	// maxResponseHeaderBytes caps a reply's headers: a platform (or a proxy
	// in front of it) sending endless headers must not grow memory.
	maxResponseHeaderBytes = 64 << 10
	// maxDrainBytes more are read and discarded so the connection can be
	// reused; past that it is closed.
	maxDrainBytes = 256 << 10
	// maxSnippetBytes of a reply are quoted in last_error.
	maxSnippetBytes = 512
)

// transport makes the platform requests: it adds the credentials to the
// mapped body at send time, POSTs it, and reads the reply within the request
// timeout. It never decides what a reply means (outcome.go does).
type transport struct {
	client  *http.Client
	conns   *http.Transport
	timeout time.Duration
	// credPrefix opens every request body: `{"access_name":…,"access_pwd":…`.
	credPrefix []byte
	redact     *redactor
	// copyHeaders says a rule reads the reply's headers.
	copyHeaders bool
}

func newTransport(timeout time.Duration, maxInFlight int, tlsConf *tls.Config, name, pwd string) *transport {
	// HTTP/1.1 with keep-alive and as many idle connections as slots: Go's
	// default of 2 idle connections per host cost 15-20 % at 64 in flight,
	// and cleartext HTTP/2 was 35-50 % slower than HTTP/1.1 on loopback.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	conns := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		DialContext:            (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		Protocols:              protocols,
		MaxIdleConns:           maxInFlight,
		MaxIdleConnsPerHost:    maxInFlight,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    timeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		TLSClientConfig:        tlsConf,
	}
	qName, _ := json.Marshal(name)
	qPwd, _ := json.Marshal(pwd)
	return &transport{
		client: &http.Client{
			Transport: conns,
			// A redirect is classified like any reply, never followed:
			// following it would send the credentials in the body to
			// another address.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		conns:      conns,
		timeout:    timeout,
		credPrefix: fmt.Appendf(nil, `{"access_name":%s,"access_pwd":%s`, qName, qPwd),
		redact:     newRedactor(name, pwd),
	}
}

// body adds the credentials as the first keys of the mapped JSON object,
// without re-encoding it.
func (t *transport) body(mapped []byte) ([]byte, error) {
	rest := bytes.TrimLeft(mapped, " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return nil, errors.New("the mapped body is not a JSON object")
	}
	rest = rest[1:]
	out := make([]byte, 0, len(t.credPrefix)+1+len(rest))
	out = append(out, t.credPrefix...)
	if inner := bytes.TrimLeft(rest, " \t\r\n"); len(inner) > 0 && inner[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...), nil
}

// response is what came back from one request, as rules and outcomes see it.
// Everything in it is already free of credentials.
type response struct {
	// Status is the HTTP status, 0 when no reply came.
	Status int
	// Headers by canonical name, first value; only when a rule reads them.
	Headers map[string]string
	// Body is the reply parsed as JSON; nil when it is not JSON or too long.
	Body any
	// Snippet is the start of the reply, for last_error.
	Snippet string
	// Err is the transport error (timeout, refused connection), "" when a
	// reply came; TimedOut says the request timeout ran out.
	Err      string
	TimedOut bool
	// RetryAfter is the reply's Retry-After header.
	RetryAfter string
	// Stopped says the caller's context ended (shutdown) before a reply:
	// not the platform's doing.
	Stopped bool
}

// do POSTs body to url within timeout (at most the transport's) and reads
// the reply.
func (t *transport) do(ctx context.Context, url string, header http.Header, body []byte, timeout time.Duration) response {
	var r response
	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		r.Err = t.redact.text("building the request: " + err.Error())
		return r
	}
	req.Header = header
	if trace.SpanContextFromContext(ctx).IsValid() {
		// The request's own span (docs/operations.md, "Tracing"): the
		// platform can continue the trace. header may be shared.
		req.Header = header.Clone()
		tracectx.InjectHeader(ctx, req.Header)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		t.transportError(ctx, reqCtx, timeout, err, &r)
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.RetryAfter = resp.Header.Get("Retry-After")
	if t.copyHeaders {
		r.Headers = make(map[string]string, len(resp.Header))
		for k, vs := range resp.Header {
			if len(vs) > 0 {
				r.Headers[k] = t.redact.text(vs[0])
			}
		}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		t.transportError(ctx, reqCtx, timeout, err, &r)
		r.Err = "reading the reply: " + r.Err
	}
	truncated := len(b) > maxResponseBytes
	if truncated {
		b = b[:maxResponseBytes]
		// Drain a little more so the connection can be reused; a reply
		// longer than that closes it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))
	}
	var parsed any
	if err == nil && !truncated && len(b) > 0 && json.Unmarshal(b, &parsed) == nil {
		r.Body = parsed
	}
	r.Body, r.Snippet = t.redact.reply(b, r.Body)
	if truncated {
		r.Snippet = strings.TrimSuffix(r.Snippet, "…") + "…"
	}
	return r
}

func (t *transport) transportError(ctx, reqCtx context.Context, timeout time.Duration, err error, r *response) {
	switch {
	case ctx.Err() != nil:
		r.Stopped = true
		r.Err = "not finished: the output stopped during the request"
	case errors.Is(reqCtx.Err(), context.DeadlineExceeded):
		r.TimedOut = true
		r.Err = fmt.Sprintf("request timed out after %v", timeout)
	default:
		r.Err = t.redact.text(err.Error())
	}
}

func (t *transport) close() { t.conns.CloseIdleConnections() }

// cleartextHost returns the host a URL would send the credentials to in
// clear text: an http:// URL whose host is not loopback. It returns "" for
// https://, loopback hosts and URLs that do not parse.
func cleartextHost(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || !strings.EqualFold(u.Scheme, "http") {
		return ""
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return ""
	}
	return host
}
