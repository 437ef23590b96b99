package kafka

import (
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// traceBatch starts the kafka.consume span of every message of batch
// (docs/operations.md, "Tracing"), continuing the trace of its record's
// traceparent header when it has one, and puts it in the message's
// context, which the outbox processor's insert continues. The span ends
// when the batch is acknowledged (persisted), or given up on.
func traceBatch(tracer trace.Tracer, batch service.MessageBatch, ack service.AckFunc) service.AckFunc {
	spans := make([]trace.Span, len(batch))
	for i, msg := range batch {
		k, _ := msgmeta.ReadKafka(msg)
		ctx, span := tracer.Start(tracectx.FromMessage(msg.Context(), msg), tracectx.SpanConsume,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.destination.name", k.Topic),
				attribute.Int("messaging.destination.partition.id", int(k.Partition)),
				attribute.Int64("messaging.kafka.offset", k.Offset),
			))
		batch[i] = msg.WithContext(ctx)
		spans[i] = span
	}
	return tracectx.EndOnAck(spans, ack)
}
