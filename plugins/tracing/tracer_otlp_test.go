package tracing

import (
	"context"
	"strings"
	"testing"

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
		tp, err := newOtlpFromParsed(conf, func(k string) string { return env[k] })
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
