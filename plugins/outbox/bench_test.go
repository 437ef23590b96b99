package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The processor against the floor of its approach, a raw pgx unnest insert of
// the same rows with no validation, key extraction or NOTIFY:
//
//	go test ./plugins/outbox -run '^$' -bench 'OutboxProcessor|RawUnnestInsert|OutboxVsRaw' -benchtime 300x
//
// On a shared machine the two separate benchmarks see different load; the
// interleaved one alternates batches between the two and reports their ratio.

// benchBatch is the batch size of the insert benchmarks.
const benchBatch = 500

// rawInsertSQL is the baseline: one unnest insert of the messages and their
// delivery states, nothing else (the keys of the benchmark are new, so the
// delivery's unique key is all the dedupe it does).
const rawInsertSQL = `WITH m AS (
	INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::bytea[], $7::bytea[])
	RETURNING id, created_at, message_key, octet_length(payload) AS payload_size
	)
	INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
	SELECT id, created_at, message_key, 'PENDING', now(), payload_size FROM m
	ON CONFLICT (message_key) DO NOTHING`

// benchMessages is what the Kafka input would hand the processor.
func benchMessages(offset *int64) service.MessageBatch {
	batch := make(service.MessageBatch, benchBatch)
	for i := range batch {
		batch[i] = kmsg(topicVehicle, 0, *offset, vehicle("bench-"+strconv.FormatInt(*offset, 10)))
		*offset++
	}
	return batch
}

// benchArrays is the same batch as the baseline's parameters.
func benchArrays(offset *int64) []any {
	var (
		keys       = make([]string, benchBatch)
		apiTypes   = make([]string, benchBatch)
		topics     = make([]string, benchBatch)
		partitions = make([]int32, benchBatch)
		offsets    = make([]int64, benchBatch)
		kafkaKeys  = make([][]byte, benchBatch)
		payloads   = make([][]byte, benchBatch)
	)
	for i := range benchBatch {
		keys[i] = "bench-" + strconv.FormatInt(*offset, 10)
		apiTypes[i], topics[i], offsets[i] = outboxdb.APITypeVehicleEvent, topicVehicle, *offset
		kafkaKeys[i], payloads[i] = []byte("CAM-0001"), vehicle(keys[i])
		*offset++
	}
	return []any{keys, apiTypes, topics, partitions, offsets, kafkaKeys, payloads}
}

type benchTargets struct {
	proc       *outboxProcessor
	raw        *pgxpool.Pool
	procDSN    string
	rawDSN     string
	procOffset int64
	rawOffset  int64
}

// newBenchTargets opens both sides on fresh databases and runs one untimed
// batch through each, so that connecting and preparing are not measured.
func newBenchTargets(b *testing.B) *benchTargets {
	b.Helper()
	ctx := context.Background()
	t := &benchTargets{procDSN: pgtest.NewDB(b), rawDSN: pgtest.NewDB(b)}
	var err error
	if t.proc, err = newProcessor(t.procDSN, defaultYAML, &logRecorder{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = t.proc.Close(ctx) })
	if t.raw, err = outboxdb.Open(ctx, t.rawDSN, outboxdb.PoolConfig{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.raw.Close)
	t.procBatch(b, benchMessages(&t.procOffset))
	t.rawBatch(b, benchArrays(&t.rawOffset))
	return t
}

func (t *benchTargets) procBatch(b *testing.B, batch service.MessageBatch) {
	if out, err := t.proc.ProcessBatch(context.Background(), batch); err != nil || len(out) != 0 {
		b.Fatalf("ProcessBatch: %v", err)
	}
}

func (t *benchTargets) rawBatch(b *testing.B, args []any) {
	if _, err := t.raw.Exec(context.Background(), rawInsertSQL, args...); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkOutboxProcessor(b *testing.B) {
	t := newBenchTargets(b)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		batch := benchMessages(&t.procOffset)
		b.StartTimer()
		t.procBatch(b, batch)
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "rows/s")
	assertRows(b, t.procDSN, (b.N+1)*benchBatch)
}

func BenchmarkRawUnnestInsert(b *testing.B) {
	t := newBenchTargets(b)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		args := benchArrays(&t.rawOffset)
		b.StartTimer()
		t.rawBatch(b, args)
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "rows/s")
	assertRows(b, t.rawDSN, (b.N+1)*benchBatch)
}

// BenchmarkOutboxVsRaw alternates batches between the processor and the raw
// insert, so both see the same load, and reports processor/raw throughput.
func BenchmarkOutboxVsRaw(b *testing.B) {
	t := newBenchTargets(b)
	var procTime, rawTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		batch, args := benchMessages(&t.procOffset), benchArrays(&t.rawOffset)
		// Alternate who goes first: whoever follows the batch building pays
		// for its garbage collection, and the second may find warmer caches.
		if i%2 == 0 {
			start := time.Now()
			t.procBatch(b, batch)
			mid := time.Now()
			t.rawBatch(b, args)
			procTime += mid.Sub(start)
			rawTime += time.Since(mid)
		} else {
			start := time.Now()
			t.rawBatch(b, args)
			mid := time.Now()
			t.procBatch(b, batch)
			rawTime += mid.Sub(start)
			procTime += time.Since(mid)
		}
	}
	rows := float64(b.N * benchBatch)
	b.ReportMetric(rows/procTime.Seconds(), "outbox-rows/s")
	b.ReportMetric(rows/rawTime.Seconds(), "raw-rows/s")
	b.ReportMetric(rawTime.Seconds()/procTime.Seconds(), "ratio")
	assertRows(b, t.procDSN, (b.N+1)*benchBatch)
}

func assertRows(b *testing.B, dsn string, want int) {
	b.Helper()
	b.StopTimer()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM forward_records").Scan(&n); err != nil {
		b.Fatal(err)
	}
	if n != want {
		b.Fatalf("%d rows, want %d", n, want)
	}
}

// BenchmarkMessageID compares the one-pass scanner that validates a payload
// and finds its messageId with encoding/json's ways of doing the same.
func BenchmarkMessageID(b *testing.B) {
	payload := vehicle("8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11")
	b.Run("Scanner", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for range b.N {
			why, id := inspectPayload(payload, 1<<20)
			if _, ok, _ := id[memberMessageID].key(); why != "" || !ok {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("UnmarshalStruct", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for range b.N {
			var v struct {
				MessageID json.RawMessage `json:"messageId"`
			}
			if err := json.Unmarshal(payload, &v); err != nil || len(v.MessageID) == 0 {
				b.Fatal(err)
			}
		}
	})
	b.Run("UnmarshalMap", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for range b.N {
			var v map[string]any
			if err := json.Unmarshal(payload, &v); err != nil {
				b.Fatal(err)
			}
			_ = fmt.Sprint(v["messageId"])
		}
	})
}

// BenchmarkOutboxProcessorTraced is BenchmarkOutboxProcessor with tracing
// on and every trace sampled: each message gets its outbox.insert span (a
// child of its kafka.consume span) and stores its trace context, and the
// spans go to the SDK's batch span processor, whose exporter discards
// them. Against BenchmarkOutboxProcessor it is the cost of tracing the
// insert (docs/benchmarks.md, "Tracing").
//
//	go test ./plugins/outbox -run '^$' -bench 'OutboxProcessor(Traced)?$' -benchtime 100x -count 3
func BenchmarkOutboxProcessorTraced(b *testing.B) {
	t := newBenchTargets(b)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	t.proc.tracer = tp.Tracer("bench")
	consume := tp.Tracer("kafka")
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		batch := benchMessages(&t.procOffset)
		spans := make([]trace.Span, len(batch))
		for i, msg := range batch {
			var ctx context.Context
			ctx, spans[i] = consume.Start(context.Background(), "kafka.consume")
			batch[i] = msg.WithContext(ctx)
		}
		b.StartTimer()
		t.procBatch(b, batch)
		b.StopTimer()
		for _, s := range spans {
			s.End()
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "rows/s")
	assertRows(b, t.procDSN, (b.N+1)*benchBatch)
	// Every row stored its trace context.
	var untraced int
	if err := t.proc.pool.QueryRow(context.Background(), `SELECT count(*) FROM forward_messages WHERE trace_parent IS NULL`).Scan(&untraced); err != nil || untraced != benchBatch {
		b.Fatalf("%d rows without a trace context (%v), want only the untimed first batch's %d", untraced, err, benchBatch)
	}
}

// discardExporter is an exporter that sends nowhere.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkTraceInserts is the tracing work of one batch alone, without
// the database: the outbox.insert span of each message, its trace context
// formatted for the row, the spans ended into a batch span processor.
// ns/msg is what tracing adds to the insert of a message.
func BenchmarkTraceInserts(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer, consume := tp.Tracer("bench"), tp.Tracer("kafka")
	var offset int64
	batch := benchMessages(&offset)
	for i, msg := range batch {
		ctx, span := consume.Start(context.Background(), "kafka.consume")
		span.End()
		batch[i] = msg.WithContext(ctx)
	}
	recs := make([]outboxdb.NewRecord, len(batch))
	b.ResetTimer()
	for range b.N {
		traceInserts(tracer, batch, recs)(nil)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/msg")
	if recs[0].TraceParent == "" {
		b.Fatal("no trace context formatted")
	}
}
