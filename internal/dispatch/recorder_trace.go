package dispatch

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// RecordDurablyTraced is RecordDurably with the outbox.record span of each
// result (docs/operations.md, "Tracing"): a child of the span in
// parents[i] (the context of results[i]'s request), for the results whose
// parent has one. A span ends when the write does, saying whether its
// result was recorded or its claim had been lost.
func (r *Recorder) RecordDurablyTraced(ctx context.Context, tracer trace.Tracer, parents []context.Context, results []outboxdb.Result, claimsEnd time.Time) ([]int64, error) {
	spans := make([]trace.Span, len(results))
	for i, p := range parents {
		if i >= len(results) || !trace.SpanContextFromContext(p).IsValid() {
			continue
		}
		res := results[i]
		_, spans[i] = tracer.Start(p, tracectx.SpanRecord, trace.WithAttributes(
			attribute.Int64("outbox.id", res.ID),
			attribute.String("outbox.status", string(res.Status)),
		))
	}
	ids, err := r.RecordDurably(ctx, results, claimsEnd)
	for i, s := range spans {
		if s == nil {
			continue
		}
		recorded := err == nil && slices.Contains(ids, results[i].ID)
		s.SetAttributes(attribute.Bool("outbox.recorded", recorded))
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "writing the result failed")
		}
		s.End()
	}
	return ids, err
}
