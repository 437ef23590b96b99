package kafkatest

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Codec is a compression codec of a record batch, by its attribute bits.
type Codec int16

// The codecs ProduceBomb writes, at their fastest levels as a producer that
// wants a small batch would not even need.
const (
	Gzip Codec = 1
	Zstd Codec = 4
)

// ProduceBomb writes a decompression bomb to topic's partition and returns
// its offset: one record batch holding one record of size zero bytes,
// compressed with codec, in the format franz-go's producer writes (v2 batch,
// a single gzip member or a single zstd frame that declares its content
// size). The record is compressed as a stream, so that its size bytes never
// exist in memory: franz-go's producer builds the whole uncompressed batch
// first, and for a 1000 MiB record that took a minute of CPU, most of it the
// copy and the garbage collector waiting for it.
func (c *Cluster) ProduceBomb(t testing.TB, topic string, partition int32, size int, codec Codec) int64 {
	t.Helper()
	records, err := compressedRecord(size, codec)
	if err != nil {
		t.Fatalf("kafkatest: compressing the bomb: %v", err)
	}
	now := time.Now().UnixMilli()
	batch := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1,
		Magic:                2,
		Attributes:           int16(codec),
		FirstTimestamp:       now,
		MaxTimestamp:         now,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           1,
		Records:              records,
	}
	raw := batch.AppendTo(nil)
	batch.Length = int32(len(raw) - 12) // after FirstOffset and Length
	raw = batch.AppendTo(raw[:0])
	// The checksum covers everything after the CRC field (byte 21 on).
	batch.CRC = int32(crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	raw = batch.AppendTo(raw[:0])

	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	topics, err := c.Admin(t).ListTopics(ctx, topic)
	if err != nil {
		t.Fatalf("kafkatest: describing topic %q: %v", topic, err)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks = -1
	req.TimeoutMillis = int32(opTimeout.Milliseconds())
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = topic, topics[topic].ID
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = partition, raw
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	// The cluster has one broker, which leads every partition.
	resp, err := req.RequestWith(ctx, c.Client(t))
	if err != nil {
		t.Fatalf("kafkatest: producing the bomb: %v", err)
	}
	for _, st := range resp.Topics {
		for _, sp := range st.Partitions {
			if err := kerr.ErrorForCode(sp.ErrorCode); err != nil {
				t.Fatalf("kafkatest: producing the bomb to %s/%d: %v", topic, partition, err)
			}
			return sp.BaseOffset
		}
	}
	t.Fatalf("kafkatest: producing the bomb: no answer for %s/%d", topic, partition)
	return 0
}

// compressedRecord is the records section of a batch of one record of size
// zero bytes (no key, no headers), compressed with codec.
func compressedRecord(size int, codec Codec) ([]byte, error) {
	body := []byte{0}                  // attributes
	body = kbin.AppendVarlong(body, 0) // timestamp delta
	body = kbin.AppendVarint(body, 0)  // offset delta
	body = kbin.AppendVarint(body, -1) // no key
	body = kbin.AppendVarint(body, int32(size))
	headers := kbin.AppendVarint(nil, 0)
	head := kbin.AppendVarint(nil, int32(len(body)+size+len(headers)))
	head = append(head, body...)
	total := int64(len(head) + size + len(headers))

	var out bytes.Buffer
	var w io.WriteCloser
	switch codec {
	case Gzip:
		gw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
		if err != nil {
			return nil, err
		}
		w = gw
	case Zstd:
		zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		zw.ResetContentSize(&out, total)
		w = zw
	default:
		return nil, fmt.Errorf("codec %d is neither gzip (%d) nor zstd (%d)", codec, Gzip, Zstd)
	}
	zeros := make([]byte, 1<<20)
	if _, err := w.Write(head); err != nil {
		return nil, err
	}
	for left := size; left > 0; left -= len(zeros) {
		if _, err := w.Write(zeros[:min(left, len(zeros))]); err != nil {
			return nil, err
		}
	}
	if _, err := w.Write(headers); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
