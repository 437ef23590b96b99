package outbox

import (
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// traceInserts starts the outbox.insert span of every message of batch, a
// child of its kafka.consume span (docs/operations.md, "Tracing"), and
// gives its record the span's trace context to store, which every later
// claim of the row continues. The returned func ends the spans with the
// batch's outcome.
func traceInserts(tracer trace.Tracer, batch service.MessageBatch, recs []outboxdb.NewRecord) func(error) {
	spans := make([]trace.Span, len(batch))
	for i, msg := range batch {
		ctx, span := tracer.Start(msg.Context(), tracectx.SpanInsert, trace.WithAttributes(
			attribute.String("outbox.message_key", recs[i].MessageKey),
			attribute.String("outbox.api_type", recs[i].APIType),
			attribute.String("outbox.status", string(recs[i].Status)),
		))
		recs[i].TraceParent = tracectx.Format(ctx)
		spans[i] = span
	}
	return func(err error) {
		for _, s := range spans {
			if err != nil {
				s.RecordError(err)
				s.SetStatus(codes.Error, "persisting the batch failed")
			}
			s.End()
		}
	}
}
