package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"

	"google.golang.org/protobuf/proto"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

// spanReceiver is an OTLP/HTTP trace receiver for -latency-traces: the
// forwarder exports the spans of every message (kafka.consume,
// outbox.insert, outbox.claim, platform.request, outbox.record) to it, and
// it keeps when each began and ended, so that a stall in the latency
// phase can be placed in one step of the messages it held.
type spanReceiver struct {
	srv    *http.Server
	url    string
	mu     sync.Mutex
	spans  []spanTimes
	closed bool
}

// spanTimes is what the receiver keeps of a span.
type spanTimes struct {
	trace, id, parent string
	name              string
	start, end        uint64 // Unix nanoseconds
	key               string // outbox.message_key, on the insert's span
}

func startSpanReceiver() (*spanReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &spanReceiver{url: "http://" + ln.Addr().String()}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.export)}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *spanReceiver) export(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	body, err := io.ReadAll(req.Body)
	var ex coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &ex)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []spanTimes
	for _, rs := range ex.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				st := spanTimes{
					trace: hex.EncodeToString(s.GetTraceId()), id: hex.EncodeToString(s.GetSpanId()),
					parent: hex.EncodeToString(s.GetParentSpanId()), name: s.GetName(),
					start: s.GetStartTimeUnixNano(), end: s.GetEndTimeUnixNano(),
				}
				for _, a := range s.GetAttributes() {
					if a.GetKey() == "outbox.message_key" {
						st.key = a.GetValue().GetStringValue()
					}
				}
				got = append(got, st)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// close stops the receiver and writes every span it kept to path: one line
// a span, its times in Unix microseconds. Only the first call writes.
func (r *spanReceiver) close(path string) error {
	_ = r.srv.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "trace\tspan\tparent\tname\tstart_unix_us\tend_unix_us\tmessage_key")
	for _, s := range r.spans {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.trace, s.id, s.parent, s.name, s.start/1000, s.end/1000, s.key)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
