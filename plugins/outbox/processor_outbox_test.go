package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	topicVehicle   = "device-vehicle-event"
	topicHeartbeat = "device-heartbeat"
)

// logRecorder is a slog handler that keeps every record, for assertions on
// what the processor logs.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level contain substr.
func (l *logRecorder) count(level slog.Level, substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level == level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

func (l *logRecorder) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.records {
		fmt.Fprintf(&b, "%s %s\n", r.Level, r.Message)
	}
	return b.String()
}

// waitFor polls cond until it holds, failing the test after a generous bound
// (a hang guard, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type testBundle struct {
	pool *pgxpool.Pool
	dsn  string
	logs *logRecorder
	// res are the resources of the bundle's stream.
	res *service.Resources
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	logs := &logRecorder{}
	res := service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(slog.New(logs))))
	return &testBundle{pool: pool, dsn: dsn, logs: logs, res: res}
}

// processor builds an outbox processor from YAML; the dsn is added.
func (b *testBundle) processor(t *testing.T, yaml string) *outboxProcessor {
	t.Helper()
	p, err := newProcessorIn(b.res, b.dsn, yaml)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func newProcessor(dsn, yaml string, logs *logRecorder) (*outboxProcessor, error) {
	return newProcessorIn(service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(slog.New(logs)))), dsn, yaml)
}

func newProcessorIn(res *service.Resources, dsn, yaml string) (*outboxProcessor, error) {
	conf, err := outboxProcessorSpec().ParseYAML(fmt.Sprintf("dsn: %q\n%s", dsn, yaml), nil)
	if err != nil {
		return nil, err
	}
	return newOutboxProcessorFromParsed(conf, res)
}

const defaultYAML = `
api_types:
  device-vehicle-event: VEHICLE_EVENT
  device-heartbeat: HEARTBEAT
`

// kmsg is a message as kafka_franz delivers it.
func kmsg(topic string, partition int32, offset int64, body []byte) *service.Message {
	m := service.NewMessage(body)
	m.MetaSetMut(msgmeta.KafkaTopic, topic)
	m.MetaSetMut(msgmeta.KafkaPartition, partition)
	m.MetaSetMut(msgmeta.KafkaOffset, offset)
	m.MetaSetMut(msgmeta.KafkaKey, "CAM-0001")
	return m
}

func vehicle(id string) []byte {
	return []byte(`{"messageId": "` + id + `", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012",
 "itemId": 73421, "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1, "inoutTime": 1779330600000,
 "plateCredible": 0.854, "pictures": [{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"}]}`)
}

func heartbeat(id string) []byte {
	return []byte(`{"messageId": "` + id + `", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012",
 "captureTime": 1779330900000, "picType": 3, "picUrl": "jieshun/2026/05/21/P1001/hb.jpg"}`)
}

type row struct {
	ID             int64
	MessageKey     string
	APIType        string
	KafkaTopic     string
	KafkaPartition int32
	KafkaOffset    int64
	KafkaKey       []byte
	Payload        []byte
	Status         string
	AttemptCount   int
	NextRetryAt    *time.Time
	LastError      *string
	UpdatedAt      time.Time
}

func (b *testBundle) rows(t *testing.T) map[string]row {
	t.Helper()
	return readRows(t, b.pool)
}

func readRows(t *testing.T, pool *pgxpool.Pool) map[string]row {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT id, message_key, api_type, kafka_topic,
		kafka_partition, kafka_offset, kafka_key, payload, status, attempt_count, next_retry_at,
		last_error, updated_at FROM forward_records`)
	if err != nil {
		t.Fatal(err)
	}
	list, err := pgx.CollectRows(rs, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]row, len(list))
	for _, r := range list {
		out[r.MessageKey] = r
	}
	return out
}

func process(t *testing.T, p *outboxProcessor, msgs ...*service.Message) []service.MessageBatch {
	t.Helper()
	out, err := p.ProcessBatch(context.Background(), service.MessageBatch(msgs))
	if err != nil {
		t.Fatalf("ProcessBatch: %v", err)
	}
	return out
}

func TestOutboxProcessor(t *testing.T) {
	t.Parallel()

	t.Run("PersistsTheBatchAndReturnsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		v, h := vehicle("8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11"), heartbeat("0d5c8a9e-3f1b-4c55-8b52-2f7e1a9c4d60")
		noKey := kmsg(topicHeartbeat, 0, 9, h)
		noKey.MetaDelete(msgmeta.KafkaKey)
		if out := process(t, p, kmsg(topicVehicle, 3, 41, v), noKey); len(out) != 0 {
			t.Fatalf("emit none returned %d batches, want none so the batch is acked", len(out))
		}
		rows := b.rows(t)
		vr, hr := rows["8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11"], rows["0d5c8a9e-3f1b-4c55-8b52-2f7e1a9c4d60"]
		if len(rows) != 2 || vr.Status != "PENDING" || vr.APIType != "VEHICLE_EVENT" || vr.KafkaTopic != topicVehicle ||
			vr.KafkaPartition != 3 || vr.KafkaOffset != 41 || string(vr.KafkaKey) != "CAM-0001" ||
			!bytes.Equal(vr.Payload, v) || vr.NextRetryAt == nil || vr.LastError != nil {
			t.Fatalf("vehicle row = %+v", vr)
		}
		if hr.Status != "PENDING" || hr.APIType != "HEARTBEAT" || hr.KafkaKey != nil || !bytes.Equal(hr.Payload, h) {
			t.Fatalf("heartbeat row = %+v", hr)
		}
	})

	t.Run("LookupColumnsComeFromTheTopLevelOfThePayload", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		process(t, p,
			kmsg(topicVehicle, 0, 1, vehicle("full")),
			kmsg(topicVehicle, 0, 2, []byte(`{"messageId":"nested","deviceId":7,"info":{"plateNo":"X1"},"parkCode":"P\u0031","berthCode":null}`)),
			kmsg(topicVehicle, 0, 3, []byte(`not json`)))
		type lookup struct{ Plate, Park, Berth, Device *string }
		read := func(key string) lookup {
			var l lookup
			if err := b.pool.QueryRow(context.Background(), `SELECT plate_no, park_code, berth_code, device_id
				FROM forward_records WHERE message_key = $1`, key).Scan(&l.Plate, &l.Park, &l.Berth, &l.Device); err != nil {
				t.Fatal(err)
			}
			return l
		}
		if l := read("full"); str(l.Plate) != "粤B12345" || str(l.Park) != "P1001" || str(l.Berth) != "B-012" || str(l.Device) != "CAM-0001" {
			t.Errorf("full vehicle event: %s %s %s %s", str(l.Plate), str(l.Park), str(l.Berth), str(l.Device))
		}
		// Only top-level members count; escapes are decoded, numbers kept as
		// written, null and absent members stay NULL.
		if l := read("nested"); l.Plate != nil || str(l.Park) != "P1" || l.Berth != nil || str(l.Device) != "7" {
			t.Errorf("nested: plate %v park %q berth %v device %q", l.Plate, str(l.Park), l.Berth, str(l.Device))
		}
		if l := read(topicVehicle + "-0-3"); l.Plate != nil || l.Park != nil || l.Berth != nil || l.Device != nil {
			t.Errorf("a payload that is not JSON has lookup values: %+v", l)
		}
	})

	t.Run("SameKeyInABatchAndAcrossBatchesMakesOneRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("a")), kmsg(topicVehicle, 0, 2, vehicle("b")), kmsg(topicVehicle, 1, 7, vehicle("a")))
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("a")), kmsg(topicVehicle, 0, 3, vehicle("b")))
		rows := b.rows(t)
		if len(rows) != 2 {
			t.Fatalf("%d rows, want 2: %+v", len(rows), rows)
		}
		if a := rows["a"]; a.KafkaPartition != 0 || a.KafkaOffset != 1 {
			t.Fatalf("row a from %d/%d, want the first message (0/1)", a.KafkaPartition, a.KafkaOffset)
		}
		if rows["b"].KafkaOffset != 2 {
			t.Fatalf("row b was overwritten by the later batch: %+v", rows["b"])
		}
	})

	t.Run("AKeyReusedWithAnotherPayloadIsReported", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		process(t, p, kmsg(topicVehicle, 0, 1, vehicle("a")), kmsg(topicVehicle, 0, 2, vehicle("b")))
		process(t, p,
			kmsg(topicVehicle, 0, 1, vehicle("a")), // redelivered: the same bytes
			kmsg(topicVehicle, 1, 5, []byte(`{"messageId":"b","deviceId":"CAM-0002"}`)),
			kmsg(topicVehicle, 1, 6, vehicle("c")),
			kmsg(topicVehicle, 1, 7, []byte(`{"messageId":"c","deviceId":"CAM-0003"}`)),
		)
		if rows := b.rows(t); len(rows) != 3 || rows["b"].KafkaOffset != 2 || rows["c"].KafkaOffset != 6 {
			t.Fatalf("rows %+v, want a, b and c as first stored", rows)
		}
		if err := p.Close(context.Background()); err != nil { // flushes the log's burst
			t.Fatal(err)
		}
		logs := b.logs.all()
		for _, want := range []string{
			`Message device-vehicle-event[1]@5 not stored: its key "b" is stored already with a different payload`,
			`Message device-vehicle-event[1]@7 not stored: its key "c"`,
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("the log does not say %q:\n%s", want, logs)
			}
		}
		if strings.Contains(logs, "@1 not stored") {
			t.Errorf("a redelivery of the same bytes was reported:\n%s", logs)
		}
	})

	t.Run("RedeliveryOfAFinishedRowChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		batch := []*service.Message{kmsg(topicVehicle, 0, 1, vehicle("ok")), kmsg(topicVehicle, 0, 2, vehicle("ko"))}
		process(t, p, batch...)
		ctx := context.Background()
		if _, err := b.pool.Exec(ctx, `UPDATE forward_deliveries SET attempt_count = 1 WHERE message_key = 'ok'`); err != nil {
			t.Fatal(err)
		}
		if n := fixture.New(t, b.pool).Deliver("message_key = 'ok'"); n != 1 {
			t.Fatalf("delivered %d rows, want 1", n)
		}
		// ko is held behind ok (same berth) until ok finishes.
		if _, err := b.pool.Exec(ctx, `UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL, order_held = false,
			attempt_count = 5, last_error = 'platform said 998' WHERE message_key = 'ko'`); err != nil {
			t.Fatal(err)
		}
		before := b.rows(t)
		process(t, p, batch...)
		process(t, p, kmsg(topicVehicle, 4, 99, vehicle("ok")), kmsg(topicVehicle, 4, 100, vehicle("ko")))
		after := b.rows(t)
		if len(after) != 2 {
			t.Fatalf("%d rows after redelivery, want 2", len(after))
		}
		for k, r := range before {
			a := after[k]
			if a.Status != r.Status || a.AttemptCount != r.AttemptCount || !a.UpdatedAt.Equal(r.UpdatedAt) ||
				a.KafkaOffset != r.KafkaOffset || (a.NextRetryAt == nil) != (r.NextRetryAt == nil) {
				t.Errorf("row %s changed on redelivery: %+v -> %+v", k, r, a)
			}
		}
	})

	t.Run("MissingMessageIDFallsBackToKafkaCoordinates", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		m := kmsg(topicVehicle, 2, 10, []byte(`{"deviceId":"CAM-0001"}`))
		m.MetaSetMut(msgmeta.KafkaPartition, "2") // metadata may also arrive as text
		m.MetaSetMut(msgmeta.KafkaOffset, "10")
		process(t, p,
			m,
			kmsg(topicVehicle, 2, 11, []byte(`{"messageId":"","deviceId":"CAM-0001"}`)),
			kmsg(topicVehicle, 2, 12, []byte(`{"messageId":null}`)),
			kmsg(topicHeartbeat, 0, 13, []byte(`{"messageId":12345678901234567890,"x":1}`)),
			kmsg(topicHeartbeat, 0, 14, []byte(`{"nested":{"messageId":"inner"},"messageid":"case"}`)),
			kmsg(topicHeartbeat, 0, 15, []byte(` {"messageId":"first","messageId":"last"} `)),
			kmsg(topicHeartbeat, 0, 16, []byte(`{"message\u0049d":"escaped\n\"name\""}`)),
		)
		rows := b.rows(t)
		for key, want := range map[string]int64{
			"device-vehicle-event-2-10": 10,
			"device-vehicle-event-2-11": 11,
			"device-vehicle-event-2-12": 12,
			"12345678901234567890":      13,
			"device-heartbeat-0-14":     14,
			"last":                      15,
			"escaped\n\"name\"":         16,
		} {
			r, ok := rows[key]
			if !ok || r.KafkaOffset != want || r.Status != "PENDING" {
				t.Errorf("key %q: row %+v (found %v), want PENDING offset %d", key, r, ok, want)
			}
		}
		if len(rows) != 7 {
			t.Errorf("%d rows, want 7", len(rows))
		}
		if n := b.logs.count(slog.LevelWarn, "fallback key"); n != 4 {
			t.Errorf("%d fallback-key warnings, want 4:\n%s", n, b.logs.all())
		}
	})

	t.Run("BadPayloadsAreStoredFailedAndTheNextGoodOnePersists", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		big := append(append([]byte(`{"messageId":"big","pad":"`), bytes.Repeat([]byte("x"), 2<<20)...), `"}`...)
		badUTF8 := []byte("{\"messageId\":\"u\",\"plateNo\":\"\xff\xfeB\"}")
		tombstone := kmsg(topicVehicle, 0, 2, nil)
		tombstone.MetaDelete(msgmeta.KafkaKey)
		msgs := []*service.Message{
			kmsg(topicVehicle, 0, 1, []byte(`not json {`)),
			tombstone,
			kmsg(topicVehicle, 0, 3, []byte(`[{"messageId":"arr"}]`)),
			kmsg(topicVehicle, 0, 4, badUTF8),
			kmsg(topicVehicle, 0, 5, big),
			kmsg("some-other-topic", 0, 6, vehicle("unknown-topic")),
			kmsg(topicVehicle, 0, 7, []byte(`{"messageId":"`+strings.Repeat("k", 2000)+`"}`)),
			kmsg(topicVehicle, 0, 8, []byte(`{"messageId":"nul\u0000"}`)),
			kmsg(topicVehicle, 0, 9, []byte(`"just a string"`)),
			kmsg(topicVehicle, 0, 10, vehicle("good")),
		}
		process(t, p, msgs...)
		rows := b.rows(t)
		for key, want := range map[string]string{
			"device-vehicle-event-0-1": "payload is not valid JSON: invalid character 'o' in literal null (expecting 'u')",
			"device-vehicle-event-0-2": "payload is empty",
			"device-vehicle-event-0-3": "payload is a JSON array, not an object",
			"device-vehicle-event-0-4": "payload is not valid UTF-8 (first bad byte at offset 28)",
			"device-vehicle-event-0-5": fmt.Sprintf("payload is %d bytes, larger than max_payload_bytes (1048576)", len(big)),
			"unknown-topic":            `kafka_topic "some-other-topic" has no entry in api_types`,
			"device-vehicle-event-0-7": "message key is unusable: key is 2000 bytes, longer than the 1024-byte limit",
			"device-vehicle-event-0-8": "message key is unusable: key contains a NUL character",
			"device-vehicle-event-0-9": "payload is a JSON string, not an object",
		} {
			r, ok := rows[key]
			if !ok {
				t.Errorf("no row for %q", key)
				continue
			}
			if r.Status != "FAILED" || r.NextRetryAt != nil || r.LastError == nil || *r.LastError != want {
				t.Errorf("row %q: status %s next_retry_at %v last_error %v, want FAILED with %q", key, r.Status, r.NextRetryAt, deref(r.LastError), want)
			}
		}
		if r := rows["device-vehicle-event-0-4"]; !bytes.Equal(r.Payload, badUTF8) {
			t.Errorf("invalid UTF-8 payload not stored byte for byte: %q", r.Payload)
		}
		if r := rows["device-vehicle-event-0-5"]; len(r.Payload) != len(big) {
			t.Errorf("oversized payload stored as %d bytes, want %d", len(r.Payload), len(big))
		}
		if r := rows["device-vehicle-event-0-2"]; r.Payload == nil || len(r.Payload) != 0 || r.KafkaKey != nil {
			t.Errorf("tombstone row: payload %v key %v, want empty payload and NULL key", r.Payload, r.KafkaKey)
		}
		if r := rows["unknown-topic"]; r.APIType != apiTypeUnknown {
			t.Errorf("unknown topic stored with api_type %q, want %s", r.APIType, apiTypeUnknown)
		}
		if r := rows["good"]; r.Status != "PENDING" || r.APIType != "VEHICLE_EVENT" {
			t.Errorf("good message after bad ones: %+v", r)
		}
		// A later batch with a good message persists too.
		process(t, p, kmsg(topicVehicle, 0, 11, vehicle("good-2")))
		if r := b.rows(t)["good-2"]; r.Status != "PENDING" {
			t.Errorf("next batch's good message: %+v", r)
		}
	})

	t.Run("RecordsTheInputMarkedOversizeAreFailedWithoutPayload", func(t *testing.T) {
		// kafka_franz delivers a record it would not read whole as an
		// empty message marked kafka_oversize (docs/guarantees.md #17).
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		const (
			batchWhy  = "record batch at offsets 12 to 14 does not decompress within 67108864 bytes (4 times max_message_bytes, 16777216), so none of its records was read"
			recordWhy = "record value is 20971520 bytes, more than max_message_bytes (16777216)"
		)
		refused := kmsg(topicVehicle, 0, 12, nil)
		refused.MetaDelete(msgmeta.KafkaKey)
		msgmeta.SetOversize(refused, batchWhy)
		// Whatever the body, a marked message's payload is not stored.
		cut := kmsg(topicHeartbeat, 1, 15, heartbeat("cut"))
		msgmeta.SetOversize(cut, recordWhy)
		process(t, p, refused, cut, kmsg(topicVehicle, 0, 16, vehicle("after")))
		rows := b.rows(t)
		for key, want := range map[string]struct{ apiType, reason string }{
			"device-vehicle-event-0-12": {"VEHICLE_EVENT", "payload not stored: " + batchWhy},
			"device-heartbeat-1-15":     {"HEARTBEAT", "payload not stored: " + recordWhy},
		} {
			r, ok := rows[key]
			if !ok {
				t.Errorf("no row for %q", key)
				continue
			}
			if r.Status != "FAILED" || deref(r.LastError) != want.reason || len(r.Payload) != 0 || r.APIType != want.apiType {
				t.Errorf("row %q: status %s, api_type %s, last_error %q, %d payload bytes; want FAILED, %s, %q, none",
					key, r.Status, r.APIType, deref(r.LastError), len(r.Payload), want.apiType, want.reason)
			}
		}
		if _, ok := rows["cut"]; ok {
			t.Errorf("the marked message was stored under the messageId of a payload that was not stored")
		}
		if r := rows["after"]; r.Status != "PENDING" {
			t.Errorf("the message after them: %+v", r)
		}
	})

	t.Run("LargeBatchesAreSplitIntoSeveralStatements", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		p.chunkBytes = 1000 // about three vehicle events per statement
		var batch []*service.Message
		for i := range 10 {
			batch = append(batch, kmsg(topicVehicle, 0, int64(i), vehicle(fmt.Sprintf("m%d", i%8))))
		}
		process(t, p, batch...)
		rows := b.rows(t)
		if len(rows) != 8 {
			t.Fatalf("%d rows, want 8 (m0 and m1 repeat)", len(rows))
		}
		// A repeat in a later statement leaves the first row alone; a later
		// statement's rows have later ids.
		for i := range 8 {
			key := fmt.Sprintf("m%d", i)
			if rows[key].KafkaOffset != int64(i) || (i > 0 && rows[key].ID <= rows[fmt.Sprintf("m%d", i-1)].ID) {
				t.Errorf("row %s: offset %d id %d, want offset %d and an id above m%d's", key, rows[key].KafkaOffset, rows[key].ID, i, i-1)
			}
		}
		// Each statement commits on its own: its rows carry its transaction.
		var statements int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(DISTINCT xmin::text) FROM forward_messages`).Scan(&statements); err != nil {
			t.Fatal(err)
		}
		if statements < 3 {
			t.Errorf("the rows were written by %d statements, want at least 3 for 10 messages of about 330 bytes in chunks of 1000", statements)
		}
	})

	t.Run("KeyAndAPITypeInterpolations", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, `
key: '${! meta("event_id").or("") }'
api_type: '${! meta("event_type") }'
`)
		m1 := kmsg(topicVehicle, 0, 1, vehicle("ignored"))
		m1.MetaSetMut("event_id", "custom-1")
		m1.MetaSetMut("event_type", "HEARTBEAT")
		m2 := kmsg(topicVehicle, 0, 2, vehicle("ignored-too"))
		m2.MetaSetMut("event_type", "PARKING")
		process(t, p, m1, m2)
		rows := b.rows(t)
		if r := rows["custom-1"]; r.Status != "PENDING" || r.APIType != "HEARTBEAT" {
			t.Errorf("interpolated key/api_type: %+v", r)
		}
		r := rows["device-vehicle-event-0-2"]
		if r.Status != "FAILED" || r.APIType != apiTypeUnknown || deref(r.LastError) != `api_type evaluated to "PARKING", want VEHICLE_EVENT or HEARTBEAT` {
			t.Errorf("bad api_type: %+v (%s)", r, deref(r.LastError))
		}
	})

	t.Run("ConcurrentProcessorsWithOverlappingKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		procs := []*outboxProcessor{b.processor(t, defaultYAML), b.processor(t, defaultYAML)}
		const keys, workers, rounds = 300, 4, 6
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for range rounds {
					batch := make(service.MessageBatch, 0, 100)
					for _, k := range rng.Perm(keys)[:100] {
						batch = append(batch, kmsg(topicVehicle, 0, int64(k), vehicle(fmt.Sprintf("key-%03d", k))))
					}
					if out, err := procs[w%2].ProcessBatch(context.Background(), batch); err != nil || len(out) != 0 {
						errs <- fmt.Errorf("ProcessBatch: %v (%d batches out)", err, len(out))
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		var n, distinct int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_key) FROM forward_records`).Scan(&n, &distinct); err != nil {
			t.Fatal(err)
		}
		if n != distinct || n == 0 {
			t.Fatalf("%d rows for %d keys", n, distinct)
		}
		if c := b.logs.count(slog.LevelError, ""); c != 0 {
			t.Fatalf("errors logged:\n%s", b.logs.all())
		}
	})

	t.Run("UnreachableDatabaseBlocksThenReturnsTheContextError", func(t *testing.T) {
		t.Parallel()
		logs := &logRecorder{}
		// Nothing listens on port 1; constructing must still succeed (no network).
		p, err := newProcessor("postgres://postgres@127.0.0.1:1/forwarder?sslmode=disable&connect_timeout=2", defaultYAML, logs)
		if err != nil {
			t.Fatalf("constructor touched the network or failed: %v", err)
		}
		defer p.Close(context.Background())
		p.retryInitial, p.retryMax = time.Millisecond, 5*time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		var out []service.MessageBatch
		go func() {
			var err error
			out, err = p.ProcessBatch(ctx, service.MessageBatch{kmsg(topicVehicle, 0, 1, vehicle("x"))})
			done <- err
		}()
		waitFor(t, "several failed attempts", func() bool { return logs.count(slog.LevelDebug, "Still cannot persist") >= 3 })
		select {
		case err := <-done:
			t.Fatalf("ProcessBatch returned %v while the database was down; it must block", err)
		default:
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || out != nil {
			t.Fatalf("ProcessBatch after cancel = %v, %v; want context.Canceled and no messages (so the batch is nacked)", out, err)
		}
		if n := logs.count(slog.LevelError, "Cannot persist"); n != 1 {
			t.Fatalf("%d error lines for one outage, want 1:\n%s", n, logs.all())
		}
		if n := logs.count(slog.LevelError, "Still cannot persist"); n != 0 {
			t.Fatalf("%d repeated error lines within a minute:\n%s", n, logs.all())
		}
	})

	t.Run("ALastingFailureIsLoggedAgainPeriodically", func(t *testing.T) {
		t.Parallel()
		logs := &logRecorder{}
		p, err := newProcessor("postgres://postgres@127.0.0.1:1/forwarder?sslmode=disable&connect_timeout=2", defaultYAML, logs)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		p.retryInitial, p.retryMax, p.outageLogEvery = time.Millisecond, 5*time.Millisecond, 50*time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := p.ProcessBatch(ctx, service.MessageBatch{kmsg(topicVehicle, 0, 1, vehicle("x"))})
			done <- err
		}()
		// A permanent failure keeps the batch held; it must keep showing at
		// ERROR, not only in its first line.
		waitFor(t, "repeated error lines", func() bool { return logs.count(slog.LevelError, "Still cannot persist") >= 2 })
		cancel()
		<-done
		if strings.Contains(logs.all(), "forwarder?sslmode") {
			t.Fatalf("the DSN leaked into the logs:\n%s", logs.all())
		}
	})

	t.Run("ConfigErrors", func(t *testing.T) {
		t.Parallel()
		for name, yaml := range map[string]string{
			"both api_types and api_type": defaultYAML + "api_type: HEARTBEAT\n",
			"neither":                     "emit: none\n",
			"bad api type":                "api_types: {t: PARKING}\n",
			"bad max_payload_bytes":       defaultYAML + "max_payload_bytes: 0\n",
			"bad emit":                    defaultYAML + "emit: all\n",
			"emit new, removed":           defaultYAML + "emit: new\n",
		} {
			if p, err := newProcessor("postgres://localhost/x", yaml, &logRecorder{}); err == nil {
				_ = p.Close(context.Background())
				t.Errorf("%s: no error", name)
			}
		}
		if _, err := newProcessor("postgres://localhost/x", defaultYAML+"emit: new\n", &logRecorder{}); err == nil || !strings.Contains(err.Error(), "field emit") {
			t.Errorf("emit: new: error %v, want one naming the field", err)
		}
		if _, err := newProcessor("postgres://u:secret@localhost:bad/x", defaultYAML, &logRecorder{}); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("bad dsn: error %v, want one without the password", err)
		}
	})

	t.Run("LintRules", func(t *testing.T) {
		t.Parallel()
		for name, yaml := range map[string]string{
			"both":    `outbox: { dsn: x, api_types: { t: HEARTBEAT }, api_type: HEARTBEAT }`,
			"neither": `outbox: { dsn: x }`,
			"max":     `outbox: { dsn: x, api_type: HEARTBEAT, max_payload_bytes: 0 }`,
			"emit":    `outbox: { dsn: x, api_type: HEARTBEAT, emit: new }`,
		} {
			if err := service.NewStreamBuilder().AddProcessorYAML(yaml); err == nil {
				t.Errorf("%s: lint passed", name)
			}
		}
		if err := service.NewStreamBuilder().AddProcessorYAML(`outbox: { dsn: x, api_types: { t: HEARTBEAT } }`); err != nil {
			t.Errorf("valid config: %v", err)
		}
	})
}

// TestCloseLeavesNoGoroutines runs before the parallel tests resume, so the
// goroutines it checks are its own.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	b := setup(t)
	ignore := goleak.IgnoreCurrent()
	p, err := newProcessor(b.dsn, defaultYAML, b.logs)
	if err != nil {
		t.Fatal(err)
	}
	process(t, p, kmsg(topicVehicle, 0, 1, vehicle("a")))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, ignore)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestKeyConflictCheckThatFailsIsLogged: the check for keys reused with
// another payload runs after the batch is committed and returns nothing to
// fail it with; when it fails (the database went away in between) it says
// so at WARN, and a check cut short by the stream stopping says nothing.
func TestKeyConflictCheckThatFailsIsLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, "api_type: HEARTBEAT")
	gone, err := pgxpool.New(context.Background(), b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	live := p.pool
	p.pool = gone
	t.Cleanup(func() { p.pool = live })
	chunk := []outboxdb.NewRecord{{MessageKey: "k-1", Payload: []byte(`{"messageId":"k-1"}`)}}

	// First, as the log is rate-limited per kind of message.
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	p.checkKeyConflicts(stopped, chunk)
	if n := b.logs.count(slog.LevelWarn, "Could not check"); n != 0 {
		t.Errorf("a check cut short by the stream stopping was logged:\n%s", b.logs.all())
	}

	p.checkKeyConflicts(context.Background(), chunk)
	const want = "Could not check the duplicate keys of a batch for other payloads: comparing the payloads of duplicate keys: closed pool"
	if n := b.logs.count(slog.LevelWarn, want); n != 1 {
		t.Errorf("a failed check was logged %d times, want once with %q:\n%s", n, want, b.logs.all())
	}
}
