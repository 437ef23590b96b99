package outboxretry

import (
	"context"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// traceClaims starts the outbox.claim span of every traced row of batch
// (docs/operations.md, "Tracing"): a child of the span that inserted the
// message, whose trace context the claim returned, however long ago that
// was. It is the message's context through the pipeline, so the request
// and the result write are its children, and it ends when the batch is
// acknowledged (its results written). Rows stored without a trace context
// get no span.
func traceClaims(tracer trace.Tracer, rows []outboxdb.Record, batch service.MessageBatch, ack service.AckFunc) service.AckFunc {
	var spans []trace.Span
	for i, r := range rows {
		if r.TraceParent == nil {
			continue
		}
		ctx, span := tracer.Start(tracectx.Parse(context.Background(), *r.TraceParent), tracectx.SpanClaim,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.Int64("outbox.id", r.ID),
				attribute.String("outbox.message_key", r.MessageKey),
				attribute.Int("outbox.attempt", r.AttemptCount),
			))
		batch[i] = batch[i].WithContext(ctx)
		spans = append(spans, span)
	}
	if len(spans) == 0 {
		return ack
	}
	return tracectx.EndOnAck(spans, ack)
}
