package integration_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	_ "github.com/forwarder/forwarder/plugins/httpforwarder"
	_ "github.com/forwarder/forwarder/plugins/outboxretry"
	_ "github.com/forwarder/forwarder/plugins/tracing"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/otlpreceiver"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The W3C trace context the producer put on the Kafka record.
const (
	producerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan   = "00f067aa0ba902b7"
	producerHeader = "00-" + producerTrace + "-" + producerSpan + "-01"
)

// newOTLPReceiver starts an OTLP/HTTP trace receiver for one test.
func newOTLPReceiver(t *testing.T) *otlpreceiver.Receiver {
	rcv, err := otlpreceiver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcv.Close)
	return rcv
}

// receivedSpans returns what rcv received, failing the test on an export
// it could not decode.
func receivedSpans(t *testing.T, rcv *otlpreceiver.Receiver) (spans []*tracepb.Span, exports int) {
	t.Helper()
	spans, exports, err := rcv.Spans()
	if err != nil {
		t.Errorf("OTLP receiver: %v", err)
	}
	return spans, exports
}

// flakyPlatform answers the first request of every message errcode 999
// (busy: retry) and accepts the next, and keeps the traceparent header of
// every request.
type flakyPlatform struct {
	mu           sync.Mutex
	seen         map[string]int
	traceparents []string
	accepted     int
}

func newFlakyPlatform(t *testing.T) (*flakyPlatform, string) {
	p := &flakyPlatform{seen: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.traceparents = append(p.traceparents, r.Header.Get("traceparent"))
		key := string(body)
		if i := bytes.Index(body, []byte(`"messageId"`)); i >= 0 {
			key = string(body[i:min(len(body), i+40)])
		}
		p.seen[key]++
		if p.seen[key] == 1 {
			_, _ = w.Write([]byte(`{"result":1,"errcode":"999","errmsg":"busy"}`))
			return
		}
		p.accepted++
		_, _ = w.Write([]byte(`{"result":0}`))
	}))
	t.Cleanup(srv.Close)
	return p, srv.URL
}

func (p *flakyPlatform) state() (accepted int, traceparents []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, append([]string(nil), p.traceparents...)
}

// tracedConfig adds the otlp tracer to fullStream's, and retries due
// 300ms after a failed attempt.
const tracedConfig = `    retry:
      initial: 300ms
      jitter: 0
tracer:
  otlp:
    sampling_ratio: 1`

// runTraced produces one record with the producer's traceparent header,
// runs the traced stream until the platform accepted it (after failing it
// once), stops the stream (which flushes the spans) and returns the
// platform and the stored trace_parent of the message.
func runTraced(t *testing.T, endpoint string) (*flakyPlatform, *string) {
	t.Helper()
	ctx := context.Background()
	const topic = "device-vehicle-event"
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	dsn := pgtest.NewDB(t)
	kc := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	platform, url := newFlakyPlatform(t)
	logs := &logbuf.Buffer{}
	stop := startStream(t, logs, slog.LevelInfo, fullStream(kc.Brokers(), topic, dsn, url, passThrough, tracedConfig))
	kc.Produce(t, &kgo.Record{Topic: topic, Key: []byte("CAM-0001"), Value: vehicle("traced-1"),
		Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(producerHeader)}}})
	waitFor(t, "the platform to accept the message on its second attempt", func() bool {
		n, _ := platform.state()
		return n == 1
	})
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	waitFor(t, "the result to be recorded", func() bool {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM forward_records WHERE message_key = 'traced-1'`).Scan(&status)
		return err == nil && status == "SUCCESS"
	})
	var stored *string
	if err := pool.QueryRow(ctx, `SELECT trace_parent FROM forward_messages WHERE message_key = 'traced-1'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	// Stopping flushes the spans.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return platform, stored
}

// TestTraceFollowsOneMessage: with the otlp tracer on, one message's spans,
// decoded from the OTLP export, are all in the trace of its Kafka record's
// traceparent, and chain consume → insert → claim → request → result write,
// for the first attempt and for the retry claimed later from the database
// (docs/operations.md, "Tracing"). The requests carry their outcome and
// errcode, and the platform received the trace in their traceparent.
func TestTraceFollowsOneMessage(t *testing.T) {
	rcv := newOTLPReceiver(t)
	platform, stored := runTraced(t, rcv.URL)

	spans, _ := receivedSpans(t, rcv)
	if len(spans) == 0 {
		t.Fatal("nothing was exported")
	}
	byID := map[string]*tracepb.Span{}
	children := map[string][]*tracepb.Span{}
	for _, s := range spans {
		if got := hex.EncodeToString(s.GetTraceId()); got != producerTrace {
			t.Errorf("span %s is in trace %s, want the record's %s", s.GetName(), got, producerTrace)
		}
		id, parent := hex.EncodeToString(s.GetSpanId()), hex.EncodeToString(s.GetParentSpanId())
		byID[id] = s
		children[parent] = append(children[parent], s)
	}
	named := func(parent, name string) []*tracepb.Span {
		var out []*tracepb.Span
		for _, s := range children[parent] {
			if s.GetName() == name {
				out = append(out, s)
			}
		}
		return out
	}
	id := func(s *tracepb.Span) string { return hex.EncodeToString(s.GetSpanId()) }

	t.Logf("the message's spans:\n%s", spanTree(children, producerSpan, ""))

	consume := named(producerSpan, "kafka.consume")
	if len(consume) != 1 {
		t.Fatalf("%d kafka.consume spans under the record's span %s, want 1", len(consume), producerSpan)
	}
	insert := named(id(consume[0]), "outbox.insert")
	if len(insert) != 1 {
		t.Fatalf("%d outbox.insert spans under kafka.consume, want 1", len(insert))
	}
	if stored == nil || !strings.Contains(*stored, id(insert[0])) || !strings.Contains(*stored, producerTrace) {
		t.Errorf("stored trace_parent %v, want the insert span %s of trace %s", stored, id(insert[0]), producerTrace)
	}
	claims := named(id(insert[0]), "outbox.claim")
	if len(claims) != 2 {
		t.Fatalf("%d outbox.claim spans under outbox.insert, want 2 (the first attempt and the retry)", len(claims))
	}
	sort.Slice(claims, func(i, j int) bool {
		return intAttr(claims[i], "outbox.attempt") < intAttr(claims[j], "outbox.attempt")
	})
	want := []struct {
		outcome, errcode string
	}{{"retry", "999"}, {"success", ""}}
	var requestIDs []string
	for i, c := range claims {
		if got := intAttr(c, "outbox.attempt"); got != int64(i+1) {
			t.Errorf("claim %d has outbox.attempt %d", i+1, got)
		}
		reqs := named(id(c), "platform.request")
		if len(reqs) != 1 {
			t.Fatalf("attempt %d: %d platform.request spans under its claim, want 1", i+1, len(reqs))
		}
		r := reqs[0]
		requestIDs = append(requestIDs, id(r))
		if got := strAttr(r, "forwarder.outcome"); got != want[i].outcome {
			t.Errorf("attempt %d: request outcome %q, want %q", i+1, got, want[i].outcome)
		}
		if got, ok := attr(r, "platform.errcode"); !ok || got.GetStringValue() != want[i].errcode {
			t.Errorf("attempt %d: request errcode %q (set %v), want %q", i+1, got.GetStringValue(), ok, want[i].errcode)
		}
		if n := len(named(id(r), "outbox.record")); n != 1 {
			t.Errorf("attempt %d: %d outbox.record spans under its request, want 1", i+1, n)
		} else if rec := named(id(r), "outbox.record")[0]; !boolAttr(rec, "outbox.recorded") {
			t.Errorf("attempt %d: the result write says it did not record", i+1)
		}
	}

	_, sent := platform.state()
	if len(sent) != 2 {
		t.Fatalf("the platform got %d requests, want 2", len(sent))
	}
	for i, tp := range sent {
		if want := "00-" + producerTrace + "-" + requestIDs[i] + "-01"; tp != want {
			t.Errorf("request %d carried traceparent %q, want %q (its request span)", i+1, tp, want)
		}
	}
}

// TestTracingOffExportsNothing: with the tracer configured but no endpoint
// (the shipped pipeline's default), nothing is exported, the message
// stores no trace context although its record had one, and the platform
// gets no traceparent.
func TestTracingOffExportsNothing(t *testing.T) {
	rcv := newOTLPReceiver(t)
	platform, stored := runTraced(t, "")
	if stored != nil {
		t.Errorf("stored trace_parent %q with tracing off, want NULL", *stored)
	}
	if spans, exports := receivedSpans(t, rcv); exports > 0 || len(spans) > 0 {
		t.Errorf("%d exports, %d spans with tracing off", exports, len(spans))
	}
	_, sent := platform.state()
	for i, tp := range sent {
		if tp != "" {
			t.Errorf("request %d carried traceparent %q with tracing off", i+1, tp)
		}
	}
}

func attr(s *tracepb.Span, key string) (*commonpb.AnyValue, bool) {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue(), true
		}
	}
	return nil, false
}

func strAttr(s *tracepb.Span, key string) string {
	v, _ := attr(s, key)
	return v.GetStringValue()
}

func intAttr(s *tracepb.Span, key string) int64 {
	v, _ := attr(s, key)
	return v.GetIntValue()
}

func boolAttr(s *tracepb.Span, key string) bool {
	v, _ := attr(s, key)
	return v.GetBoolValue()
}

// spanTree renders the spans under parent, one a line, indented by depth,
// with their attributes: what docs/operations.md shows.
func spanTree(children map[string][]*tracepb.Span, parent, indent string) string {
	var b strings.Builder
	kids := children[parent]
	sort.Slice(kids, func(i, j int) bool { return kids[i].GetStartTimeUnixNano() < kids[j].GetStartTimeUnixNano() })
	for _, s := range kids {
		var attrs []string
		for _, kv := range s.GetAttributes() {
			v := kv.GetValue()
			var text string
			switch v.GetValue().(type) {
			case *commonpb.AnyValue_IntValue:
				text = fmt.Sprint(v.GetIntValue())
			case *commonpb.AnyValue_BoolValue:
				text = fmt.Sprint(v.GetBoolValue())
			default:
				text = fmt.Sprintf("%q", v.GetStringValue())
			}
			attrs = append(attrs, kv.GetKey()+"="+text)
		}
		fmt.Fprintf(&b, "%s%s %s [%s]\n", indent, s.GetName(), hex.EncodeToString(s.GetSpanId()), strings.Join(attrs, " "))
		b.WriteString(spanTree(children, hex.EncodeToString(s.GetSpanId()), indent+"  "))
	}
	return b.String()
}
