// Package tracing provides the otlp tracer: an OpenTelemetry tracer
// provider that exports the spans of every message (docs/operations.md,
// "Tracing") over OTLP/HTTP, and nothing at all until an endpoint is set.
package tracing

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	otFieldSamplingRatio = "sampling_ratio"
	otFieldServiceName   = "service_name"
)

// The OpenTelemetry SDK's own variables: the exporter reads them itself.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

var otlpSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Summary("Exports the spans of every message over OTLP/HTTP to the endpoint in `OTEL_EXPORTER_OTLP_ENDPOINT`; traces nothing while it is unset.").
		Description(`
One message's trace joins its Kafka consumption (`+"`kafka.consume`"+`, continuing the W3C
`+"`traceparent`"+` header of the record when it has one), its insert (`+"`outbox.insert`"+`), each claim of
its row, even hours later from a retry (`+"`outbox.claim`"+`), each platform request with its outcome and
errcode (`+"`platform.request`"+`, which sends `+"`traceparent`"+` to the platform) and its result write
(`+"`outbox.record`"+`). The trace context is stored with the message (`+"`forward_messages.trace_parent`"+`)
so that a retry continues it. docs/operations.md, "Tracing", shows one.

The endpoint and the exporter's other settings come from the OpenTelemetry SDK's own environment
variables, read by the exporter: `+"`OTEL_EXPORTER_OTLP_ENDPOINT`"+` (e.g. `+"`http://collector:4318`"+`; the
exporter posts to its path `+"`/v1/traces`"+`) or `+"`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`"+` (the full URL),
`+"`OTEL_EXPORTER_OTLP_HEADERS`"+`, `+"`OTEL_EXPORTER_OTLP_TIMEOUT`"+`, `+"`OTEL_EXPORTER_OTLP_CERTIFICATE`"+`.
With neither endpoint set the tracer is off: the components start no span, store no trace context
and send no `+"`traceparent`"+`, at no measurable cost.

Spans are sent in batches in the background (the SDK's batch span processor); at shutdown the
spans not sent yet are flushed. A collector that is down loses spans, never messages; the batches it
refuses are logged as one warning a minute (`+"`otlp tracer: …`"+`, then the count of the others).

Sampling is decided once per trace, where it starts: a record with a `+"`traceparent`"+` follows its
sampled flag, whatever the ratio; a record without one starts a trace sampled with probability
`+"`sampling_ratio`"+`, and every later step of the message (its claims hours later included) follows that
decision.`).
		Field(service.NewFloatField(otFieldSamplingRatio).
			Description("The share of new traces sampled, from 0 (none: only traces a `traceparent` marks sampled) to 1 (all).").
			Default(1.0).
			LintRule(fieldlint.Float(checkSamplingRatio))).
		Field(service.NewStringField(otFieldServiceName).
			Description("The `service.name` resource attribute of the spans.").
			Default("forwarder")).
		Example("Tracing on when the endpoint is set", "Every new trace sampled; `OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318` turns it on.", `
tracer:
  otlp:
    sampling_ratio: ${TRACE_SAMPLE_RATIO:1}
`)
})

func init() {
	service.MustRegisterOtelTracerProvider("otlp", otlpSpec(), func(conf *service.ParsedConfig) (trace.TracerProvider, error) {
		return newOtlpFromParsed(conf, os.Getenv, conf.Resources().Logger())
	})
}

// exportWarnWindow is how often a collector that keeps refusing spans is
// reported: one warning, then one with the count of the others.
const exportWarnWindow = time.Minute

// newOtlpFromParsed returns the provider, or a no-op one when getenv gives
// no endpoint. It never dials: the exporter connects when it first sends.
// The SDK's errors (a batch the collector did not take) become warnings on
// log.
func newOtlpFromParsed(conf *service.ParsedConfig, getenv func(string) string, log *service.Logger) (trace.TracerProvider, error) {
	ratio, err := conf.FieldFloat(otFieldSamplingRatio)
	if err != nil {
		return nil, err
	}
	if err := checkSamplingRatio(ratio); err != nil {
		return nil, err
	}
	name, err := conf.FieldString(otFieldServiceName)
	if err != nil {
		return nil, err
	}
	if getenv(envEndpoint) == "" && getenv(envTracesEndpoint) == "" {
		return noop.NewTracerProvider(), nil
	}
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		return nil, fmt.Errorf("creating the OTLP exporter: %w", err)
	}
	// The SDK's default handler prints each failed batch on standard error,
	// in a format of its own, several times a second while a collector is
	// down: lines that log pipelines reading the service's JSON cannot parse.
	warns := lograte.New(log, exportWarnWindow)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		warns.Warn("export", "otlp tracer: "+err.Error()+": these spans are lost; messages are delivered as ever")
	}))
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	), nil
}

// checkSamplingRatio is the check of sampling_ratio, which start-up runs on
// the parsed value and lint (fieldlint) on the value written.
var checkSamplingRatio = fieldlint.Range(0.0, 1.0, otFieldSamplingRatio+": %v is outside 0 to 1")
