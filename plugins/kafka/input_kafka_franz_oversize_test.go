package kafka

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestInputDecompressionBomb produces a record batch of a few KiB holding
// 64 MiB of zeros (zstd, then gzip, as franz-go's producer compresses them)
// between ordinary messages, plus a 2 MiB record whose batch stays within the
// decompression bound, and consumes them with max_message_bytes 1 MiB
// (docs/guarantees.md #17). No message carries more than 1 MiB: the bomb
// becomes one empty message at its offset whose kafka_oversize names the
// bound, the 2 MiB record an empty one naming its size; every ordinary
// message, and one of exactly 1 MiB, arrives intact, and the group's offset reaches the end of the
// partition: the partition never stalls on the bomb.
func TestInputDecompressionBomb(t *testing.T) {
	t.Parallel()
	const (
		maxMessage = 1 << 20
		bound      = batchBytesPerMessage * maxMessage
		bombSize   = 64 << 20
		largeSize  = 2 << 20 // over max_message_bytes, within the bound
	)
	for _, tc := range []struct {
		name  string
		codec kgo.CompressionCodec
		bits  int16
	}{
		// The fastest levels: the bomb is still a sliver of its size.
		{"Zstd", kgo.ZstdCompression().WithLevel(1), 4},
		{"Gzip", kgo.GzipCompression().WithLevel(1), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic, group := "bomb-"+strings.ToLower(tc.name), "g-bomb-"+strings.ToLower(tc.name)
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
			batches := watchProducedBatches(t, c, topic)
			producer := c.CompressingProducer(t, tc.codec, largeSize)
			produce := func(recs ...*kgo.Record) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					t.Fatalf("producing: %v", err)
				}
			}
			ordinary := map[int64][]byte{}
			produceOrdinary := func(n int) {
				t.Helper()
				recs := make([]*kgo.Record, n)
				for i := range recs {
					recs[i] = &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, `{"messageId":"m-%d","pad":%q}`, len(ordinary)+i, strings.Repeat("x", 200))}
				}
				produce(recs...)
				for _, r := range recs {
					ordinary[r.Offset] = r.Value
				}
			}

			produceOrdinary(5)
			bombOffset := c.ProduceBomb(t, topic, 0, bombSize, kafkatest.Codec(tc.bits))
			large := &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte{'L'}, largeSize)}
			produce(large)
			// The largest record delivered whole: exactly max_message_bytes.
			atLimit := &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte{'A'}, maxMessage)}
			produce(atLimit)
			ordinary[atLimit.Offset] = atLimit.Value
			produceOrdinary(20)
			total := len(ordinary) + 2

			// The bomb went out alone in the batch after the first five
			// records' (the producer may have split those: it sends the
			// first record at once and batches the rest behind it),
			// compressed to a sliver of its size.
			got := batches.since(0)
			i, before := 0, int32(0)
			for ; i < len(got) && before < 5; i++ {
				before += got[i].records
			}
			if before != 5 || i == len(got) || got[i].records != 1 || got[i].codec != tc.bits || got[i].bytes > bombSize/500 {
				t.Fatalf("produced batches %+v: want the bomb alone after the first five records, compressed with codec %d to under %d bytes", got, tc.bits, bombSize/500)
			}
			t.Logf("the bomb's batch: %d bytes, %d decompressed", got[i].bytes, bombSize)

			s := newSink(t)
			s.keepMsgs = true
			ts := startStream(t, s, 1, inputConf(c, topic, group,
				fmt.Sprintf("max_message_bytes: %dB", maxMessage),
				"max_buffered_bytes: 1MiB",
				"fetch_max_bytes: 1MiB"))
			waitFor(t, "every record, the bomb's included, acked", func() bool { return s.ackedCount() == total })
			waitFor(t, "the commit of the whole partition", func() bool { return c.Committed(t, group)[topic][0] == int64(total) })
			ts.stop(10 * time.Second)

			s.mu.Lock()
			defer s.mu.Unlock()
			seen := map[int64]bool{}
			for _, m := range s.msgs {
				at := msgOffset(t, m)
				seen[at.offset] = true
				body, _ := m.AsBytes()
				if len(body) > maxMessage {
					t.Errorf("offset %d: a message of %d bytes was delivered, over max_message_bytes %d", at.offset, len(body), maxMessage)
				}
				why, oversize := msgmeta.Oversize(m)
				switch at.offset {
				case bombOffset:
					want := fmt.Sprintf("record batch at offset %d does not decompress within %d bytes", bombOffset, bound)
					if !oversize || !strings.Contains(why, want) || len(body) != 0 {
						t.Errorf("the bomb at offset %d: body of %d bytes, %s %q; want an empty body and a reason containing %q",
							bombOffset, len(body), msgmeta.KafkaOversize, why, want)
					}
				case large.Offset:
					want := fmt.Sprintf("record value is %d bytes, more than max_message_bytes (%d)", largeSize, maxMessage)
					if !oversize || why != want || len(body) != 0 {
						t.Errorf("the %d-byte record: body of %d bytes, %s %q; want an empty body and %q", largeSize, len(body), msgmeta.KafkaOversize, why, want)
					}
				default:
					if oversize || !bytes.Equal(body, ordinary[at.offset]) {
						t.Errorf("ordinary message at offset %d: %s %q, body %.60q; want %.60q", at.offset, msgmeta.KafkaOversize, why, body, ordinary[at.offset])
					}
				}
			}
			for o := range int64(total) {
				if !seen[o] {
					t.Errorf("nothing was delivered for offset %d", o)
				}
			}
			if ts.logs.count("record batch at offset") == 0 {
				t.Errorf("the refused batch was not logged")
			}
		})
	}
}

// TestInputKcatDecompressionBomb has kcat (librdkafka, an independent
// producer) write 16 MiB of zeros as one compressed record between ordinary
// messages, with zstd (Produce from v3, as Kafka 4 advertises) and gzip
// (from v0, as Kafka 3 does; see TestInputKcatCompressedBatches), and
// consumes them with max_message_bytes 256 KiB: the bomb arrives as one empty
// message marked kafka_oversize, the ordinary messages intact, and the
// group's offset reaches the end of the partition (docs/guarantees.md #17).
//
// CI installs kcat; without it the test fails rather than skips.
func TestInputKcatDecompressionBomb(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat is not installed (Debian: apt-get install kcat); this test needs it: %v", err)
	}
	const (
		// kcat reads a line in time that grows faster than its length
		// (64 MiB takes minutes): a smaller limit keeps the bomb far
		// above it.
		maxMessage = 256 << 10
		bombSize   = 16 << 20
		before     = 3
		after      = 20
	)
	for _, tc := range []struct {
		codec         string
		bits          int16
		produceFromV0 bool
	}{
		{"zstd", 4, false},
		{"gzip", 1, true},
	} {
		t.Run(tc.codec, func(t *testing.T) {
			t.Parallel()
			topic, group := "kcat-bomb-"+tc.codec, "g-kcat-bomb-"+tc.codec
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
			if tc.produceFromV0 {
				advertiseProduceFromV0(t, c)
			}
			batches := watchProducedBatches(t, c, topic)

			// One message per line: the ordinary ones, the bomb (no
			// newline among its zeros), the ordinary ones.
			var lines bytes.Buffer
			value := func(i int) string {
				return fmt.Sprintf(`{"messageId":"k-%d","pad":%q}`, i, strings.Repeat("x", 200))
			}
			for i := range before {
				fmt.Fprintln(&lines, value(i))
			}
			lines.Write(make([]byte, bombSize))
			lines.WriteByte('\n')
			for i := before; i < before+after; i++ {
				fmt.Fprintln(&lines, value(i))
			}
			cmd := exec.Command(kcat, "-P", "-b", c.Brokers(), "-t", topic, "-p", "0", "-z", tc.codec,
				"-X", fmt.Sprintf("message.max.bytes=%d", bombSize+1<<20))
			cmd.Stdin = bytes.NewReader(lines.Bytes())
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("kcat -z %s: %v\n%s", tc.codec, err, out)
			}
			var bombBatch *producedBatch
			for _, b := range batches.since(0) {
				if b.records == 1 && b.codec == tc.bits && b.bytes < bombSize/500 {
					bombBatch = &b
				}
			}
			if bombBatch == nil {
				t.Fatalf("kcat -z %s: batches %+v, none holds the bomb alone compressed with codec %d", tc.codec, batches.since(0), tc.bits)
			}
			t.Logf("kcat's bomb batch: %d bytes, %d decompressed", bombBatch.bytes, bombSize)

			total := before + 1 + after
			s := newSink(t)
			s.keepMsgs = true
			ts := startStream(t, s, 1, inputConf(c, topic, group, fmt.Sprintf("max_message_bytes: %dB", maxMessage)))
			waitFor(t, "every record, the bomb's included, acked", func() bool { return s.ackedCount() == total })
			waitFor(t, "the commit of the whole partition", func() bool { return c.Committed(t, group)[topic][0] == int64(total) })
			ts.stop(10 * time.Second)

			s.mu.Lock()
			defer s.mu.Unlock()
			for _, m := range s.msgs {
				at := msgOffset(t, m)
				body, _ := m.AsBytes()
				why, oversize := msgmeta.Oversize(m)
				switch {
				case at.offset == before:
					want := fmt.Sprintf("record batch at offset %d does not decompress within %d bytes", before, batchBytesPerMessage*maxMessage)
					if !oversize || !strings.Contains(why, want) || len(body) != 0 {
						t.Errorf("the bomb: body of %d bytes, %s %q; want an empty body and a reason containing %q", len(body), msgmeta.KafkaOversize, why, want)
					}
				case at.offset < before:
					if want := value(int(at.offset)); oversize || string(body) != want {
						t.Errorf("offset %d: %q, want %q", at.offset, body, want)
					}
				default:
					if want := value(int(at.offset) - 1); oversize || string(body) != want {
						t.Errorf("offset %d: %q, want %q", at.offset, body, want)
					}
				}
			}
		})
	}
}
