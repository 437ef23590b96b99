package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// TestBoundedDecompressor checks the decompressor kafka_franz gives franz-go
// (docs/guarantees.md #17): every codec decodes data up to the bound byte
// for byte, and anything it cannot decode within the bound (more data, a
// zstd window past it, bytes that are not its codec's) is kgo.ErrMaxDecompress,
// the one error on which franz-go reports the batch's offsets rather than
// fetching it again forever.
func TestBoundedDecompressor(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	d, err := newBoundedDecompressor(limit, service.MockResources().Logger())
	if err != nil {
		t.Fatal(err)
	}
	text := func(n int) []byte { return bytes.Repeat([]byte(`{"messageId":"m","pad":"abc"} `), n/30+1)[:n] }

	zstdWith := func(src []byte, opts ...zstd.EOption) []byte {
		enc, err := zstd.NewWriter(nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		return enc.EncodeAll(src, nil)
	}
	gz := func(src []byte) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write(src)
		_ = w.Close()
		return b.Bytes()
	}
	lz := func(src []byte) []byte {
		var b bytes.Buffer
		w := lz4.NewWriter(&b)
		_, _ = w.Write(src)
		_ = w.Close()
		return b.Bytes()
	}
	xerial := func(src []byte, chunk int) []byte {
		out := append([]byte{}, xerialPrefix...)
		out = append(out, 0, 0, 0, 1, 0, 0, 0, 1)
		for len(src) > 0 {
			n := min(chunk, len(src))
			block := s2.EncodeSnappy(nil, src[:n])
			out = append(out, byte(len(block)>>24), byte(len(block)>>16), byte(len(block)>>8), byte(len(block)))
			out = append(out, block...)
			src = src[n:]
		}
		return out
	}

	for _, tc := range []struct {
		name  string
		codec kgo.CompressionCodecType
		src   []byte
		want  []byte // nil: refused
		why   string // in the refusal
	}{
		{"GzipAtTheBound", kgo.CodecGzip, gz(text(limit)), text(limit), ""},
		{"GzipPastTheBound", kgo.CodecGzip, gz(make([]byte, limit+1)), nil, "decompresses to more than 1048576 bytes"},
		{"GzipNotGzip", kgo.CodecGzip, []byte("not gzip at all"), nil, "not valid gzip data"},
		{"Lz4AtTheBound", kgo.CodecLz4, lz(text(limit)), text(limit), ""},
		{"Lz4PastTheBound", kgo.CodecLz4, lz(make([]byte, 4*limit)), nil, "decompresses to more than 1048576 bytes"},
		{"SnappyAtTheBound", kgo.CodecSnappy, s2.EncodeSnappy(nil, text(limit)), text(limit), ""},
		{"SnappyPastTheBound", kgo.CodecSnappy, s2.EncodeSnappy(nil, make([]byte, limit+1)), nil, "decompresses to more than 1048576 bytes"},
		{"XerialAtTheBound", kgo.CodecSnappy, xerial(text(limit), 32<<10), text(limit), ""},
		{"XerialPastTheBound", kgo.CodecSnappy, xerial(make([]byte, 2*limit), 32<<10), nil, "decompresses to more than 1048576 bytes"},
		{"XerialTruncated", kgo.CodecSnappy, xerial(text(100<<10), 32<<10)[:200], nil, "not valid snappy data"},
		{"ZstdAtTheBound", kgo.CodecZstd, zstdWith(text(limit)), text(limit), ""},
		{"ZstdPastTheBoundDeclared", kgo.CodecZstd, zstdWith(make([]byte, 64*limit)), nil, "decompresses to more than"},
		{"ZstdPastTheBoundUndeclared", kgo.CodecZstd, zstdWith(make([]byte, 4*limit), zstd.WithSingleSegment(false), zstd.WithWindowSize(1<<20), zstd.WithEncoderCRC(false)), nil, "decompresses to more than 1048576 bytes"},
		// librdkafka declares a 2 MiB window for any batch: one far
		// below the bound decodes whatever window it declares, up to
		// the standard levels' largest.
		{"ZstdSmallWithAStandardWindow", kgo.CodecZstd, widenWindow(t, zstdWith(text(1000), zstd.WithSingleSegment(false)), 23), text(1000), ""},
		{"ZstdWindowPastStandard", kgo.CodecZstd, widenWindow(t, zstdWith(text(1000), zstd.WithSingleSegment(false)), 25), nil, "its zstd window is 33554432 bytes, more than 8388608"},
		{"ZstdNotZstd", kgo.CodecZstd, []byte("not zstd at all"), nil, "not valid zstd data"},
		{"UnknownCodec", kgo.CompressionCodecType(7), []byte("x"), nil, "unknown compression codec 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := d.Decompress(tc.src, tc.codec)
			if tc.want != nil {
				if err != nil || !bytes.Equal(got, tc.want) {
					t.Fatalf("Decompress: %d bytes, %v; want the %d bytes compressed", len(got), err, len(tc.want))
				}
				return
			}
			if !errors.Is(err, kgo.ErrMaxDecompress) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Decompress: %d bytes, %v; want kgo.ErrMaxDecompress saying %q", len(got), err, tc.why)
			}
		})
	}
	if got, err := d.Decompress([]byte("as is"), kgo.CodecNone); err != nil || string(got) != "as is" {
		t.Errorf("an uncompressed batch: %q, %v", got, err)
	}
}

// widenWindow rewrites the window a zstd frame declares to 1<<log2 bytes,
// as a producer compressing at an --ultra level or with long-distance
// matching does (klauspost's encoder fits the window to the input). The
// frame must not be single-segment; its blocks stay valid, since a window
// only bounds how far back they may refer.
func widenWindow(t *testing.T, frame []byte, log2 int) []byte {
	t.Helper()
	// Magic (4 bytes), the frame header descriptor, then the window
	// descriptor: exponent in the high 5 bits, window = 1<<(10+exponent).
	if len(frame) < 6 || frame[4]&0x20 != 0 {
		t.Fatalf("not a zstd frame with a window descriptor: % x", frame[:min(len(frame), 8)])
	}
	out := bytes.Clone(frame)
	out[5] = byte(log2-10) << 3
	var h zstd.Header
	if err := h.Decode(out); err != nil || h.WindowSize != 1<<log2 {
		t.Fatalf("rewriting the window: %+v, %v", h, err)
	}
	return out
}

// rawCompressor is a producer's compressor that labels whatever make returns
// with codec, as a broken or hostile producer could.
type rawCompressor struct {
	codec kgo.CompressionCodecType
	make  func(src []byte) []byte
}

func (c rawCompressor) Compress(_ *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	return c.make(src), c.codec
}

// TestInputUndecodableBatch produces, between ordinary messages, a zstd batch
// franz-go's own decompressor would fetch again forever, stalling its
// partition: a zstd frame whose window is past the bound, and bytes that are
// not zstd at all. Each becomes one empty message marked kafka_oversize at
// its offset; the messages after it arrive and the group's offset reaches
// the end of the partition.
func TestInputUndecodableBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		make func(src []byte) []byte
	}{
		{"ZstdWindowPastTheBound", func(src []byte) []byte {
			enc, _ := zstd.NewWriter(nil, zstd.WithSingleSegment(false))
			defer enc.Close()
			return widenWindow(t, enc.EncodeAll(src, nil), 26)
		}},
		{"NotZstd", func([]byte) []byte { return []byte("not zstd data") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic, group := "undecodable-"+strings.ToLower(tc.name), "g-undecodable-"+strings.ToLower(tc.name)
			c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
			c.ProduceN(t, topic, 3, nil)
			bad := c.Client(t, kgo.WithCompressor(rawCompressor{kgo.CodecZstd, tc.make}), kgo.ProducerLinger(0), kgo.DefaultProduceTopic(topic))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// Large enough to compress: franz-go sends a batch that does
			// not shrink uncompressed.
			value := []byte(`{"messageId":"bad","pad":"` + strings.Repeat("x", 10<<10) + `"}`)
			if err := bad.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			c.ProduceN(t, topic, 5, nil)
			const total = 9

			s := newSink(t)
			s.keepMsgs = true
			ts := startStream(t, s, 1, inputConf(c, topic, group, "max_message_bytes: 1MiB"))
			waitFor(t, "every record acked", func() bool { return s.ackedCount() == total })
			waitFor(t, "the commit of the whole partition", func() bool { return c.Committed(t, group)[topic][0] == total })
			ts.stop(10 * time.Second)

			s.mu.Lock()
			defer s.mu.Unlock()
			for _, m := range s.msgs {
				at := msgOffset(t, m)
				why, oversize := msgmeta.Oversize(m)
				if want := fmt.Sprintf("record batch at offset 3 does not decompress within %d bytes", batchBytesPerMessage<<20); at.offset == 3 && !strings.Contains(why, want) {
					t.Errorf("the bad batch: %s %q, want it to contain %q", msgmeta.KafkaOversize, why, want)
				}
				if at.offset != 3 && oversize {
					t.Errorf("offset %d: marked %s %q", at.offset, msgmeta.KafkaOversize, why)
				}
			}
			if ts.logs.count("refusing a record batch") == 0 {
				t.Errorf("the decompressor did not log why it refused the batch")
			}
		})
	}
}
