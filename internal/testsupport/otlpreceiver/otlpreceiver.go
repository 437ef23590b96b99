// Package otlpreceiver is an OTLP/HTTP trace receiver on 127.0.0.1, for the
// tests and the bench that read the spans the forwarder exports: it keeps
// every span posted to /v1/traces.
package otlpreceiver

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver keeps the spans of every export it is sent.
type Receiver struct {
	// URL is the endpoint to export to (OTEL_EXPORTER_OTLP_ENDPOINT).
	URL string

	srv     *http.Server
	mu      sync.Mutex
	spans   []*tracepb.Span
	exports int
	bad     error
}

// Start listens on a free port of 127.0.0.1.
func Start() (*Receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Receiver{URL: "http://" + ln.Addr().String()}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.export)}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *Receiver) export(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	body, err := io.ReadAll(req.Body)
	var ex coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &ex)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.bad == nil {
			r.bad = fmt.Errorf("undecodable export: %w", err)
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.exports++
	for _, rs := range ex.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// Spans returns the spans received so far, how many exports carried them,
// and the first export that could not be decoded, if any.
func (r *Receiver) Spans() (spans []*tracepb.Span, exports int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), r.exports, r.bad
}

// Close stops the receiver; what it received stays readable.
func (r *Receiver) Close() {
	_ = r.srv.Close()
}
