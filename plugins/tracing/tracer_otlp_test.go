package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestOtlpTracer(t *testing.T) {
	t.Parallel()
	parse := func(t *testing.T, yaml string) (*sdktrace.TracerProvider, bool, error) {
		t.Helper()
		conf, err := otlpSpec().ParseYAML(yaml, nil)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		if !strings.Contains(yaml, "# no endpoint") {
			env[envEndpoint] = "http://127.0.0.1:4318"
		}
		tp, err := newOtlpFromParsed(conf, func(k string) string { return env[k] }, conf.Resources().Logger())
		if err != nil {
			return nil, false, err
		}
		if _, off := tp.(noop.TracerProvider); off {
			return nil, true, nil
		}
		sdk, ok := tp.(*sdktrace.TracerProvider)
		if !ok {
			t.Fatalf("provider %T, want the SDK's or a no-op one", tp)
		}
		t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
		return sdk, false, nil
	}

	t.Run("OffWithoutAnEndpoint", func(t *testing.T) {
		t.Parallel()
		if _, off, err := parse(t, "sampling_ratio: 1 # no endpoint"); err != nil || !off {
			t.Fatalf("without an endpoint: off %v, err %v; want a no-op provider", off, err)
		}
	})

	t.Run("OnWithAnEndpoint", func(t *testing.T) {
		t.Parallel()
		for _, ratio := range []string{"0", "0.5", "1"} {
			tp, off, err := parse(t, "sampling_ratio: "+ratio)
			if err != nil || off || tp == nil {
				t.Fatalf("ratio %s: off %v, err %v; want an exporting provider", ratio, off, err)
			}
		}
	})

	t.Run("SamplesNewTracesAtTheRatio", func(t *testing.T) {
		t.Parallel()
		for ratio, want := range map[string]bool{"0": false, "1": true} {
			tp, _, err := parse(t, "sampling_ratio: "+ratio)
			if err != nil {
				t.Fatal(err)
			}
			_, span := tp.Tracer("test").Start(context.Background(), "root")
			if got := span.SpanContext().IsSampled(); got != want {
				t.Errorf("ratio %s: a new trace sampled %v, want %v", ratio, got, want)
			}
			span.End()
		}
	})

	t.Run("FollowsTheParentsDecision", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			ratio, flags string
			want         bool
		}{{"0", "01", true}, {"1", "00", false}} {
			tp, _, err := parse(t, "sampling_ratio: "+c.ratio)
			if err != nil {
				t.Fatal(err)
			}
			parent := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-" + c.flags})
			_, span := tp.Tracer("test").Start(parent, "child")
			if got := span.SpanContext().IsSampled(); got != c.want {
				t.Errorf("ratio %s, parent flags %s: sampled %v, want %v (the parent decides)", c.ratio, c.flags, got, c.want)
			}
			span.End()
		}
	})

	t.Run("RefusesARatioOutsideZeroToOne", func(t *testing.T) {
		t.Parallel()
		for _, ratio := range []string{"-0.1", "1.5"} {
			if _, _, err := parse(t, "sampling_ratio: "+ratio); err == nil || !strings.Contains(err.Error(), "sampling_ratio") {
				t.Errorf("ratio %s: %v, want an error naming sampling_ratio", ratio, err)
			}
		}
	})
}

// TestExportFailuresAreRateLimitedWarnings: with the collector down every
// batch of spans fails to export. The SDK printed each failure on standard
// error in a format of its own, several a second; the service now logs one
// warning in its own log for all those of the window, naming the tracer and
// the cause. Not parallel: it sets the exporter's endpoint variable and the
// SDK's process-wide error handler.
func TestExportFailuresAreRateLimitedWarnings(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	t.Setenv(envEndpoint, down)

	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	log := service.NewLoggerFromSlog(slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	}), nil)))
	conf, err := otlpSpec().ParseYAML("sampling_ratio: 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := newOtlpFromParsed(conf, os.Getenv, log)
	if err != nil {
		t.Fatal(err)
	}
	sdk := tp.(*sdktrace.TracerProvider)
	for range 600 { // more than a batch (512)
		_, span := sdk.Tracer("test").Start(context.Background(), "span")
		span.End()
	}
	if err := sdk.Shutdown(context.Background()); err != nil {
		t.Logf("shutdown: %v", err)
	}
	for range 50 { // as many more failed batches as a minute of traffic
		otel.Handle(errors.New("traces export: " + down + " refused"))
	}

	mu.Lock()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	mu.Unlock()
	if len(lines) != 1 {
		t.Fatalf("%d log lines for the failed exports of one window, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var rec struct{ Level, Msg string }
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("the warning is not the service's JSON log: %v: %s", err, lines[0])
	}
	if rec.Level != "WARN" || !strings.HasPrefix(rec.Msg, "otlp tracer: traces export: ") || !strings.Contains(rec.Msg, "connection refused") ||
		!strings.HasSuffix(rec.Msg, "these spans are lost; messages are delivered as ever") {
		t.Errorf("warning %+v, want a WARN naming the tracer, the refused connection and what is lost", rec)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
