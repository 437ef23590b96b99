package deadletter_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	_ "github.com/forwarder/forwarder/plugins/deadletter"

	// The shipped example's output; a test may import a sibling plugin.
	_ "github.com/forwarder/forwarder/plugins/kafka"
)

const examplePath = "../../pipelines/examples/dead_letter.yaml"

// published is one record of the dead-letter topic.
type published struct {
	key, value string
	headers    map[string]string
}

// topicReader reads the dead-letter topic from its start.
type topicReader struct {
	cl  *kgo.Client
	all []published
}

// until reads until a record with key and reason has arrived, and returns
// every record read so far. It gives up well before the input's 60 s lease
// could bring back a row that a broken nack or requeue failed to give back.
func (r *topicReader) until(t *testing.T, key, reason string) []published {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		for _, p := range r.all {
			if p.key == key && p.headers["reason"] == reason {
				return r.all
			}
		}
		fs := r.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no record %q with reason %q on the dead-letter topic; read %d records", key, reason, len(r.all))
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("fetch: %v", err) })
		fs.EachRecord(func(rec *kgo.Record) {
			p := published{key: string(rec.Key), value: string(rec.Value), headers: map[string]string{}}
			for _, h := range rec.Headers {
				p.headers[h.Key] = string(h.Value)
			}
			r.all = append(r.all, p)
		})
	}
}

func countKey(all []published, key string) int {
	n := 0
	for _, p := range all {
		if p.key == key {
			n++
		}
	}
	return n
}

// TestExamplePipeline runs pipelines/examples/dead_letter.yaml, as shipped,
// from PostgreSQL through the real kafka_franz output into an in-process
// Kafka cluster.
//
// Not parallel: the components read DATABASE_URL from the process
// environment themselves (t.Setenv), not through the stream's lookup.
func TestExamplePipeline(t *testing.T) {
	ctx := context.Background()
	const topic = "dead-letter"
	kafka := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	dsn, pool := pgtest.NewDBPool(t)

	insert := func(key, status, reason string, payload []byte) {
		t.Helper()
		fixture.New(t, pool).Insert(fixture.Row{
			Key: key, Status: status, Topic: "device-vehicle-event", Partition: 2, Offset: 77,
			Payload: payload, Attempts: 1, LastHTTPStatus: 200, LastError: reason,
		})
	}
	// Payloads as received, one of them not even UTF-8.
	payloads := map[string][]byte{
		"m-1": []byte(`{"messageId":"m-1","inoutType":7}`),
		"m-2": {0xff, 0xfe, 0x00, '{', 0xc3},
		"m-3": []byte(`{"messageId":"m-3"}`),
	}
	reasons := map[string]string{
		"m-1": "mapping: inoutType 7 is not 0 or 1",
		"m-2": "mapping: payload is not valid JSON",
		"m-3": "platform errcode 998: do not resend",
	}
	for _, k := range []string{"m-1", "m-2", "m-3"} {
		insert(k, "FAILED", reasons[k], payloads[k])
	}
	insert("pending", "PENDING", "", []byte("{}"))
	insert("delivered", "SUCCESS", "", []byte("{}"))

	conf, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", dsn)
	env := map[string]string{
		"KAFKA_BROKERS":             kafka.Brokers(),
		"KAFKA_TOPIC_DEAD_LETTER":   topic,
		"DEAD_LETTER_POLL_INTERVAL": "50ms",
	}
	sb := service.NewStreamBuilder()
	sb.SetEnvVarLookupFunc(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err := sb.SetYAML(string(conf)); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetLoggerYAML("level: warn"); err != nil {
		t.Fatal(err)
	}

	// The broker refuses the first write after `failNext` is set, so that
	// one batch is nacked.
	var failNext, refused atomic.Bool
	kafka.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kafka.KeepControl()
		if !failNext.Load() {
			return nil, nil, false
		}
		failNext.Store(false)
		refused.Store(true)
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.InvalidRecord.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- stream.Run(runCtx) }()
	t.Cleanup(func() {
		stopCtx, c := context.WithTimeout(ctx, 30*time.Second)
		defer c()
		if err := stream.Stop(stopCtx); err != nil {
			t.Errorf("stopping the stream: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stream: %v", err)
		}
	})

	reader := &topicReader{cl: kafka.Client(t,
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}

	// Every FAILED row arrives byte for byte, keyed by its message key, with
	// its reason and API type as headers; the others never do.
	var all []published
	for _, k := range []string{"m-1", "m-2", "m-3"} {
		all = reader.until(t, k, reasons[k])
	}
	for _, p := range all {
		want, ok := payloads[p.key]
		if !ok {
			t.Fatalf("record with key %q published", p.key)
		}
		if !bytes.Equal([]byte(p.value), want) {
			t.Errorf("%s: value %q, want %q", p.key, p.value, want)
		}
		if p.headers["reason"] != reasons[p.key] || p.headers["api_type"] != "VEHICLE_EVENT" ||
			p.headers["last_http_status"] != "200" || p.headers["source_topic"] != "device-vehicle-event" ||
			p.headers["source_partition"] != "2" || p.headers["source_offset"] != "77" {
			t.Errorf("%s: headers %v", p.key, p.headers)
		}
	}

	// A batch the broker refuses is nacked, and published later.
	failNext.Store(true)
	insert("m-4", "FAILED", "attempts exhausted: 5 of 5", []byte("four"))
	reader.until(t, "m-4", "attempts exhausted: 5 of 5")
	if !refused.Load() {
		t.Fatal("the broker never refused a write: the nack was not exercised")
	}

	// A row requeued by an operator that fails again is published again,
	// with its new reason.
	n, err := outboxdb.Requeue(ctx, pool, outboxdb.RequeueFilter{Keys: []string{"m-3"}}, outboxdb.RequeueOptions{})
	if err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL,
		attempt_count = 1, last_error = 'failed again after requeue' WHERE message_key = 'm-3'`); err != nil {
		t.Fatal(err)
	}
	reader.until(t, "m-3", "failed again after requeue")

	// A last row, published after all of the above, is the mark up to which
	// nothing was published twice: the acked rows were not re-published and
	// the refused batch was written once.
	insert("last", "FAILED", "sentinel", []byte("last"))
	all = reader.until(t, "last", "sentinel")
	for key, want := range map[string]int{"m-1": 1, "m-2": 1, "m-3": 2, "m-4": 1, "last": 1, "pending": 0, "delivered": 0} {
		if got := countKey(all, key); got != want {
			t.Errorf("%s published %d times, want %d", key, got, want)
		}
	}
	// A row is marked published when its ack comes back, which trails its
	// arrival on the topic: wait for the marks rather than race them.
	var unpublished int
	for deadline := time.Now().Add(15 * time.Second); ; {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records
			WHERE status = 'FAILED' AND dead_lettered_at IS NULL`).Scan(&unpublished); err != nil {
			t.Fatal(err)
		}
		if unpublished == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if unpublished > 0 {
		t.Errorf("%d FAILED rows not marked published", unpublished)
	}
	if t.Failed() {
		var keys []string
		for _, p := range all {
			keys = append(keys, p.key+"("+p.headers["reason"]+")")
		}
		t.Logf("topic: %s", strings.Join(keys, ", "))
	}
}
