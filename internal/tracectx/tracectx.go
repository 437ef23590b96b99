// Package tracectx holds what the components share to trace one message
// from its Kafka record to its result write (docs/operations.md,
// "Tracing"): whether the stream traces at all, and the W3C trace context
// read from a record's headers, stored with the message and sent to the
// platform. The parsing and formatting are OpenTelemetry's W3C propagator.
package tracectx

import (
	"context"
	"net/http"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Name is the instrumentation scope of the forwarder's spans.
const Name = "github.com/forwarder/forwarder"

// Span names, one per step of a message (docs/operations.md, "Tracing").
const (
	SpanConsume = "kafka.consume"
	SpanInsert  = "outbox.insert"
	SpanClaim   = "outbox.claim"
	SpanRequest = "platform.request"
	SpanRecord  = "outbox.record"
)

// headerTraceParent is the W3C header (and Kafka record header) that
// carries a trace context.
const headerTraceParent = "traceparent"

var propagator = propagation.TraceContext{}

// Tracer returns the tracer of the stream's tracer provider, or nil when
// the stream does not trace: no tracer is configured, or the otlp tracer
// has no endpoint. Components then start no span and store no trace
// context, so an untraced stream pays a nil check per batch.
func Tracer(res *service.Resources) trace.Tracer {
	if res == nil {
		return nil
	}
	tp := res.OtelTracer()
	if tp == nil {
		return nil
	}
	if _, off := tp.(noop.TracerProvider); off {
		return nil
	}
	return tp.Tracer(Name)
}

// metaCarrier reads a message's metadata (its Kafka record's headers) as
// a propagation carrier.
type metaCarrier struct{ msg *service.Message }

func (c metaCarrier) Get(key string) string {
	v, _ := c.msg.MetaGet(key)
	return v
}

func (c metaCarrier) Set(key, value string) { c.msg.MetaSetMut(key, value) }

func (c metaCarrier) Keys() []string {
	var keys []string
	_ = c.msg.MetaWalkMut(func(k string, _ any) error {
		keys = append(keys, k)
		return nil
	})
	return keys
}

// FromMessage returns ctx with the trace context of msg's traceparent
// metadata as the remote parent, ctx itself when it has none or it does
// not parse.
func FromMessage(ctx context.Context, msg *service.Message) context.Context {
	return propagator.Extract(ctx, metaCarrier{msg})
}

// Format returns the span context of ctx as a traceparent value, "" when
// ctx has no valid one. Sampled or not, it is kept: a message whose trace
// was not sampled stays unsampled at every later step.
func Format(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c[headerTraceParent]
}

// Parse returns ctx with the span context of a traceparent value (Format)
// as the remote parent, ctx itself when tp is empty or does not parse.
func Parse(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{headerTraceParent: tp})
}

// InjectHeader sets the traceparent header of the span context of ctx in
// h, when ctx has a valid one.
func InjectHeader(ctx context.Context, h http.Header) {
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// EndOnAck wraps ack so that the acknowledgement ends spans: a nack records
// its error on each first.
func EndOnAck(spans []trace.Span, ack service.AckFunc) service.AckFunc {
	return func(ctx context.Context, err error) error {
		for _, s := range spans {
			if err != nil {
				s.RecordError(err)
			}
			s.End()
		}
		return ack(ctx, err)
	}
}
