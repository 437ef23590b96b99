package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// startOutput runs a stream from a producer function into kafka_franz
// configured by outputYAML (indented under kafka_franz:).
func startOutput(t *testing.T, outputYAML string) service.MessageBatchHandlerFunc {
	t.Helper()
	b := service.NewStreamBuilder()
	b.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	produce, err := b.AddBatchProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddOutputYAML("kafka_franz:\n" + indent(outputYAML, "  ")); err != nil {
		t.Fatal(err)
	}
	stream, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = stream.Run(context.Background())
		close(done)
	}()
	t.Cleanup(func() {
		_ = stream.StopWithin(10 * time.Second)
		<-done
	})
	return produce
}

// readAll consumes n records from topic, from the start.
func readAll(t *testing.T, c *kafkatest.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := c.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records from %s", len(out), n, topic)
		}
		out = append(out, f.Records()...)
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Value) < string(out[j].Value) })
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func TestOutput(t *testing.T) {
	t.Parallel()

	t.Run("TopicKeyAndHeadersFromMessages", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.New(t, []kafkatest.Topic{{Name: "out-a", Partitions: 3}, {Name: "out-b", Partitions: 1}})
		produce := startOutput(t, fmt.Sprintf(`
seed_brokers: [ %q ]
topic: 'out-${! @dest }'
key: '${! @k }'
metadata:
  include_prefixes: [ "h_" ]
batching:
  count: 4
  period: 10ms
`, c.Brokers()))

		var batch service.MessageBatch
		for i := range 6 {
			m := service.NewMessage(fmt.Appendf(nil, "v%d", i))
			m.MetaSetMut("dest", []string{"a", "b"}[i%2])
			m.MetaSetMut("k", fmt.Sprintf("key-%d", i))
			m.MetaSetMut("h_trace", fmt.Sprintf("t%d", i))
			m.MetaSetMut("secret", "not a header")
			batch = append(batch, m)
		}
		if err := produce(context.Background(), batch); err != nil {
			t.Fatalf("write: %v", err)
		}

		for topic, want := range map[string][]int{"out-a": {0, 2, 4}, "out-b": {1, 3, 5}} {
			recs := readAll(t, c, topic, len(want))
			for j, r := range recs {
				i := want[j]
				if string(r.Value) != fmt.Sprintf("v%d", i) || string(r.Key) != fmt.Sprintf("key-%d", i) {
					t.Errorf("%s: record %q key %q, want v%d key-%d", topic, r.Value, r.Key, i, i)
				}
				if h, _ := header(r, "h_trace"); h != fmt.Sprintf("t%d", i) {
					t.Errorf("%s: header h_trace = %q, want t%d", topic, h, i)
				}
				if _, ok := header(r, "secret"); ok {
					t.Errorf("%s: metadata outside the include filter became a header", topic)
				}
			}
		}
	})

	t.Run("ExplicitPartition", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.New(t, []kafkatest.Topic{{Name: "parts", Partitions: 4}})
		produce := startOutput(t, fmt.Sprintf(`
seed_brokers: [ %q ]
topic: parts
partition: '${! @p }'
`, c.Brokers()))
		var batch service.MessageBatch
		for i := range 8 {
			m := service.NewMessage(fmt.Appendf(nil, "v%d", i))
			m.MetaSetMut("p", i%4)
			batch = append(batch, m)
		}
		if err := produce(context.Background(), batch); err != nil {
			t.Fatalf("write: %v", err)
		}
		for _, r := range readAll(t, c, "parts", 8) {
			var i int
			fmt.Sscanf(string(r.Value), "v%d", &i)
			if r.Partition != int32(i%4) {
				t.Errorf("record %q in partition %d, want %d", r.Value, r.Partition, i%4)
			}
		}
	})

	t.Run("FailedWriteIsRejected", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.New(t, nil) // no topics, and kfake does not create them
		produce := startOutput(t, fmt.Sprintf(`
seed_brokers: [ %q ]
topic: missing
timeout: 300ms
`, c.Brokers()))
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := produce(ctx, service.MessageBatch{service.NewMessage([]byte("x"))}); err == nil {
			t.Fatal("a write to a missing topic was acknowledged")
		}
	})
}

func TestOutputConfigErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ yaml, want string }{
		"NoBrokers":     {"seed_brokers: [ ' , ' ]\ntopic: x", "seed_brokers"},
		"BadSize":       {"seed_brokers: [ a:1 ]\ntopic: x\nmax_message_bytes: lots", "max_message_bytes"},
		"BadMechanism":  {"seed_brokers: [ a:1 ]\ntopic: x\nsasl:\n  - mechanism: GSSAPI", "mechanism"},
		"MetadataAge":   {"seed_brokers: [ a:1 ]\ntopic: x\nmetadata_max_age: 0s", "metadata_max_age: 0s is not from 5s to 1h0m0s"},
		"BelowABatch":   {"seed_brokers: [ a:1 ]\ntopic: x\nmax_message_bytes: 511B", "max_message_bytes: 511B is below 512B, the smallest record batch franz-go builds"},
		"AboveARequest": {"seed_brokers: [ a:1 ]\ntopic: x\nmax_message_bytes: 1073741825B", `max_message_bytes: "1073741825B" must be between 1B and 1GiB`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conf, err := franzOutputSpec().ParseYAML(tc.yaml, nil)
			if err == nil {
				_, err = newFranzOutputFromParsed(conf, service.MockResources())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestOutputMaxInFlight: Benthos starts a goroutine per batch in flight,
// all at once: the output takes 1 to 10000.
func TestOutputMaxInFlight(t *testing.T) {
	t.Parallel()
	for n, want := range map[string]string{
		"1":          "",
		"10000":      "",
		"0":          "field max_in_flight: must be from 1 to 10000, got 0",
		"10001":      "field max_in_flight: must be from 1 to 10000, got 10001: Benthos starts a goroutine for each",
		"1000000000": "got 1000000000",
	} {
		conf, err := franzOutputSpec().ParseYAML("seed_brokers: [ a:1 ]\ntopic: x\nmax_in_flight: "+n, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := parseOutputFlow(conf)
		switch {
		case want == "" && (err != nil || strconv.Itoa(got) != n):
			t.Errorf("max_in_flight %s: %d, %v", n, got, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("max_in_flight %s: error %v, want %q", n, err, want)
		}
	}
}

// TestOutputClientAtTheBounds: the smallest and largest max_message_bytes
// the output accepts make a client franz-go accepts too (it checks them
// only when the client is created, in Connect).
func TestOutputClientAtTheBounds(t *testing.T) {
	t.Parallel()
	for _, size := range []string{"512B", "1MiB", "512MiB", "1GiB"} {
		t.Run(size, func(t *testing.T) {
			t.Parallel()
			conf, err := franzOutputSpec().ParseYAML("seed_brokers: [ 127.0.0.1:1 ]\ntopic: x\nmax_message_bytes: "+size, nil)
			if err != nil {
				t.Fatal(err)
			}
			o, err := newFranzOutputFromParsed(conf, service.MockResources())
			if err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(o.clientOpts...)
			if err != nil {
				t.Fatalf("franz-go refuses the client of max_message_bytes %s: %v", size, err)
			}
			cl.Close()
		})
	}
}

// TestOutputWritesToATopicCreatedAgain: after its topic is deleted and
// created again, the write that meets the new topic fails once
// (UNKNOWN_TOPIC_ID: franz-go keeps the old topic's ID) and its retry goes
// to the new topic. Without the purge every retry failed the same way.
func TestOutputWritesToATopicCreatedAgain(t *testing.T) {
	t.Parallel()
	const topic = "recreated-out"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	produce := startOutput(t, fmt.Sprintf("seed_brokers: [ %q ]\ntopic: %s\ntimeout: 20s\n", c.Brokers(), topic))
	ctx := context.Background()
	if err := produce(ctx, service.MessageBatch{service.NewMessage([]byte("old"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin(t).DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin(t).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	err := produce(ctx, service.MessageBatch{service.NewMessage([]byte("new"))})
	if err != nil && !strings.Contains(err.Error(), "UNKNOWN_TOPIC_ID") {
		t.Fatalf("the first write after the topic was created again: %v, want nil or UNKNOWN_TOPIC_ID", err)
	}
	if err != nil {
		if err := produce(ctx, service.MessageBatch{service.NewMessage([]byte("new"))}); err != nil {
			t.Fatalf("the retry of a write that met the new topic: %v", err)
		}
	}
	if recs := readAll(t, c, topic, 1); len(recs) != 1 || string(recs[0].Value) != "new" {
		t.Fatalf("the new topic holds %d records, want just %q", len(recs), "new")
	}
}

// TestMetadataMaxAgeBounds: the input reads and the output writes with the
// smallest and the largest metadata_max_age the config accepts.
func TestMetadataMaxAgeBounds(t *testing.T) {
	t.Parallel()
	for _, age := range []string{"5s", "1h"} {
		t.Run(age, func(t *testing.T) {
			t.Parallel()
			in, out, group := "age-in-"+age, "age-out-"+age, "g-age-"+age
			c := kafkatest.New(t, []kafkatest.Topic{{Name: in, Partitions: 2}, {Name: out, Partitions: 1}})
			c.ProduceN(t, in, 4, nil)
			s := newSink(t)
			startStream(t, s, 1, inputConf(c, in, group, "metadata_max_age: "+age))
			waitFor(t, "the 4 records", func() bool { return s.ackedCount() == 4 })

			produce := startOutput(t, fmt.Sprintf("seed_brokers: [ %q ]\ntopic: %s\nmetadata_max_age: %s\n", c.Brokers(), out, age))
			if err := produce(context.Background(), service.MessageBatch{service.NewMessage([]byte("x"))}); err != nil {
				t.Fatal(err)
			}
			if recs := readAll(t, c, out, 1); len(recs) != 1 || string(recs[0].Value) != "x" {
				t.Fatalf("the topic holds %d records, want the one written", len(recs))
			}
		})
	}
}
