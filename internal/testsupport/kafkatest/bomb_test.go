package kafkatest

import (
	"bytes"
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestProduceBomb: franz-go's consumer reads the bomb back as the record at
// the offset ProduceBomb returned, after ordinary records: size zero bytes,
// no key, in a batch compressed with the codec asked for to a sliver of its
// size.
func TestProduceBomb(t *testing.T) {
	const size = 8<<20 + 3 // not a whole number of the writer's chunks
	for _, tc := range []struct {
		name  string
		codec Codec
	}{{"Gzip", Gzip}, {"Zstd", Zstd}} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(t, []Topic{{Name: "bomb", Partitions: 2}})
			c.ProduceN(t, "bomb", 4, nil)
			before := c.EndOffsets(t, "bomb")[1]
			at := c.ProduceBomb(t, "bomb", 1, size, tc.codec)
			if at != before {
				t.Fatalf("the bomb is at offset %d, want %d (the partition's end before it)", at, before)
			}
			if records, err := compressedRecord(size, tc.codec); err != nil || len(records) > size/100 {
				t.Fatalf("the bomb compresses to %d bytes (%v), want under %d", len(records), err, size/100)
			}

			cl := c.Client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"bomb": {1: kgo.NewOffset().At(at)}}),
				kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20))
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			fs := cl.PollFetches(ctx)
			if err := fs.Err(); err != nil {
				t.Fatal(err)
			}
			recs := fs.Records()
			if len(recs) == 0 || recs[0].Offset != at {
				t.Fatalf("fetched %d records, want the bomb at offset %d first", len(recs), at)
			}
			if v := recs[0].Value; len(v) != size || !bytes.Equal(v, make([]byte, size)) || recs[0].Key != nil {
				t.Fatalf("the bomb reads back as %d bytes (key %q), want %d zero bytes and no key", len(v), recs[0].Key, size)
			}
			if got := recs[0].Attrs.CompressionType(); got != uint8(tc.codec) {
				t.Fatalf("the bomb's batch has codec %d, want %d", got, tc.codec)
			}
		})
	}
}
