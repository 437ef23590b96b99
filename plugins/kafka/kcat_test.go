package kafka

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputKcatCompressedBatches has kcat (librdkafka, an independent
// producer) write batches compressed with gzip, snappy, lz4 and zstd, with
// keys and headers, to a kfake broker, and checks that every message comes
// out of kafka_franz with its key, headers (as metadata) and value intact.
//
// What arrives compressed depends on the broker's advertised API versions.
// The librdkafka in kcat 1.7.1 (2.0.2) uses gzip, snappy and lz4 only if the
// broker's advertised Produce range starts at v0, and zstd only if it
// reaches v7 (rd_kafka_msgset_writer_select_MsgVersion; later librdkafka
// releases changed that check); otherwise it logs "Broker does not support
// compression type" and sends the batch uncompressed. kfake advertises
// Produce from v3, as Kafka 4 does (KIP-896), so there kcat compresses zstd
// only. Kafka 3 and older advertise Produce from v0; the second case has
// kfake advertise that to librdkafka, and all four codecs arrive
// compressed. The test reads the codec of every record batch in the
// Produce requests and requires exactly that.
//
// CI installs kcat; without it the test fails rather than skips.
func TestInputKcatCompressedBatches(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat is not installed (Debian: apt-get install kcat); this test needs it: %v", err)
	}
	for _, tc := range []struct {
		name           string
		produceFromV0  bool
		compressedWith map[string]bool // codecs that arrive compressed
	}{
		{"ProduceFromV3LikeKafka4", false, map[string]bool{"zstd": true}},
		{"ProduceFromV0LikeKafka3", true, map[string]bool{"gzip": true, "snappy": true, "lz4": true, "zstd": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.New(t, []kafkatest.Topic{{Name: "kcat", Partitions: 2}})
			if tc.produceFromV0 {
				advertiseProduceFromV0(t, c)
			}
			batches := watchProducedBatches(t, c, "kcat")
			want := produceWithKcat(t, kcat, c, "kcat", batches, tc.compressedWith)
			consumeAndCompare(t, c, "kcat", want)
		})
	}
}

// kcatCodecs are the codecs kcat is asked for, with the compression bits of
// a record batch's attributes for each.
var kcatCodecs = []struct {
	name string
	bits int16
}{{"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}}

// advertiseProduceFromV0 makes the cluster answer librdkafka's ApiVersions
// as Kafka 3 does, with Produce from v0; franz-go's clients see kfake's own
// versions. Only the advertised floor changes: librdkafka still sends its
// newest Produce version, which kfake handles.
func advertiseProduceFromV0(t *testing.T, c *kafkatest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	own, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, c.Client(t))
	if err != nil {
		t.Fatalf("asking kfake for its API versions: %v", err)
	}
	c.ControlKey(int16(kmsg.ApiVersions), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ApiVersionsRequest)
		if req.ClientSoftwareName != "librdkafka" {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
		resp.ApiKeys = append(resp.ApiKeys, own.ApiKeys...)
		for i := range resp.ApiKeys {
			if resp.ApiKeys[i].ApiKey == int16(kmsg.Produce) {
				resp.ApiKeys[i].MinVersion = 0
			}
		}
		return resp, nil, true
	})
}

// producedBatch is a record batch seen in a Produce request.
type producedBatch struct {
	magic   int8
	codec   int16
	records int32
	bytes   int // the whole batch, as sent
}

// producedBatches collects what watchProducedBatches sees.
type producedBatches struct {
	mu      sync.Mutex
	batches []producedBatch
	bad     []string
}

func (p *producedBatches) since(n int) []producedBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]producedBatch(nil), p.batches[n:]...)
}

func (p *producedBatches) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.batches)
}

// watchProducedBatches reads the record format and codec of every batch
// produced to topic, leaving the requests to kfake.
func watchProducedBatches(t *testing.T, c *kafkatest.Cluster, topic string) *producedBatches {
	t.Helper()
	// Produce v13 names the topic by its ID (franz-go sends it; librdkafka
	// 2.0 does not).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topics, err := c.Admin(t).ListTopics(ctx, topic)
	if err != nil || topics[topic].Err != nil {
		t.Fatalf("looking up topic %q: %v %v", topic, err, topics[topic].Err)
	}
	id := topics[topic].ID
	p := &producedBatches{}
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, rt := range req.Topics {
			if rt.Topic != topic && rt.TopicID != id {
				continue
			}
			for _, rp := range rt.Partitions {
				for raw := rp.Records; len(raw) > 0; {
					// baseOffset int64, batchLength int32, leader epoch
					// int32, then the magic byte.
					if len(raw) < 17 {
						p.bad = append(p.bad, fmt.Sprintf("truncated batch of %d bytes", len(raw)))
						break
					}
					size := 12 + int(int32(binary.BigEndian.Uint32(raw[8:12])))
					if size > len(raw) {
						p.bad = append(p.bad, fmt.Sprintf("batch of %d bytes in %d", size, len(raw)))
						break
					}
					var b kmsg.RecordBatch
					if magic := int8(raw[16]); magic != 2 {
						p.batches = append(p.batches, producedBatch{magic: magic})
					} else if err := b.ReadFrom(raw[:size]); err != nil {
						p.bad = append(p.bad, err.Error())
					} else {
						p.batches = append(p.batches, producedBatch{magic: b.Magic, codec: b.Attributes & 0x07, records: b.NumRecords, bytes: size})
					}
					raw = raw[size:]
				}
			}
		}
		return nil, nil, false
	})
	return p
}

// kcatMessage is a message kcat produced.
type kcatMessage struct{ value, codec string }

// produceWithKcat runs kcat once per codec, 50 "<key>\t<value>" lines each
// with the run's headers on every message, and checks the batches that
// arrive: record format v2, compressed as compressedWith says. It returns
// the messages by key.
func produceWithKcat(t *testing.T, kcat string, c *kafkatest.Cluster, topic string, seen *producedBatches, compressedWith map[string]bool) map[string]kcatMessage {
	t.Helper()
	const perCodec = 50
	want := map[string]kcatMessage{}
	dir := t.TempDir()
	for _, codec := range kcatCodecs {
		var lines bytes.Buffer
		for i := range perCodec {
			key := fmt.Sprintf("%s-%03d", codec.name, i)
			// Values that compress well: librdkafka sends a batch
			// uncompressed when compressing would not shrink it.
			value := fmt.Sprintf(`{"messageId":%q,"deviceId":"CAM-0001","plateNo":"粤B12345","pad":%q}`, key, strings.Repeat("abc", 100))
			want[key] = kcatMessage{value, codec.name}
			fmt.Fprintf(&lines, "%s\t%s\n", key, value)
		}
		file := filepath.Join(dir, codec.name+".txt")
		if err := os.WriteFile(file, lines.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}

		before := seen.count()
		out, err := exec.Command(kcat, "-P", "-b", c.Brokers(), "-t", topic, "-z", codec.name, "-K", `\t`,
			"-H", "codec="+codec.name, "-H", "trace=t-"+codec.name,
			// All lines within one linger: one batch per partition.
			"-X", "linger.ms=200", "-l", file).CombinedOutput()
		if err != nil {
			t.Fatalf("kcat -z %s: %v\n%s", codec.name, err, out)
		}

		wantBits := int16(0)
		if compressedWith[codec.name] {
			wantBits = codec.bits
		}
		var records int32
		for _, b := range seen.since(before) {
			if b.magic != 2 || b.codec != wantBits {
				t.Errorf("kcat -z %s: a batch arrived in record format v%d with codec %d, want v2 with codec %d", codec.name, b.magic, b.codec, wantBits)
			}
			records += b.records
		}
		if records != perCodec {
			t.Errorf("kcat -z %s: %d records in the Produce requests, want %d", codec.name, records, perCodec)
		}
	}
	seen.mu.Lock()
	for _, b := range seen.bad {
		t.Errorf("reading a produced batch: %s", b)
	}
	seen.mu.Unlock()
	return want
}

// consumeAndCompare consumes topic with kafka_franz and checks every message
// against want: key, value and headers.
func consumeAndCompare(t *testing.T, c *kafkatest.Cluster, topic string, want map[string]kcatMessage) {
	t.Helper()
	s := newSink(t)
	s.keepMsgs = true
	ts := startStream(t, s, 1, inputConf(c, topic, "g-"+topic))
	waitFor(t, "every message kcat produced", func() bool { return s.ackedCount() == len(want) })
	ts.stop(10 * time.Second)

	s.mu.Lock()
	defer s.mu.Unlock()
	got := map[string]bool{}
	for _, m := range s.msgs {
		key, _ := m.MetaGet(msgmeta.KafkaKey)
		w, ok := want[key]
		if !ok {
			t.Errorf("message with unexpected key %q", key)
			continue
		}
		got[key] = true
		if b, _ := m.AsBytes(); string(b) != w.value {
			t.Errorf("message %s: value %q, want %q", key, b, w.value)
		}
		for h, v := range map[string]string{"codec": w.codec, "trace": "t-" + w.codec, msgmeta.KafkaTopic: topic} {
			if g, _ := m.MetaGet(h); g != v {
				t.Errorf("message %s: metadata %s = %q, want %q", key, h, g, v)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d distinct messages delivered, want %d", len(got), len(want))
	}
}
