package kafka

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"
)

// boundedDecompressor decompresses record batches to at most max bytes, with
// the libraries franz-go's own decompressor uses, and reports every batch it
// cannot decompress within that bound as kgo.ErrMaxDecompress, whatever the
// reason: larger than the bound, a zstd frame whose window is wider than the
// bound (and than zstdWindow), or bytes that are not valid for their codec.
// franz-go then stops the partition at the batch and tells us its offsets
// (kgo.ErrDecompressTooLarge), so that the poll loop skips it and a FAILED
// row accounts for it (docs/guarantees.md #17).
//
// franz-go's own decompressor, bounded by kgo.MaxDecompressBatchBytes, does
// that only for batches that are too large: the zstd decoder refuses a frame
// whose window exceeds the bound with zstd.ErrWindowSizeExceeded, which
// franz-go (v1.22.3, compression.go, decompressZstd) passes on as an ordinary
// decompression error, and on such an error it fetches the same batch again,
// about every 10 ms, forever. librdkafka's zstd frames declare windows of a
// few MiB, so with a small max_message_bytes every batch of theirs would
// stall its partition (TestInputKcatDecompressionBomb found that); a frame
// compressed at an --ultra level, or a crafted frame header, would with any
// bound. The batch's CRC is checked before it is decompressed, so a batch
// that does not decompress never will.
type boundedDecompressor struct {
	max  int
	log  *service.Logger
	zstd *zstd.Decoder
	gzip sync.Pool // *gzip.Reader
	lz4  sync.Pool // *lz4.Reader
}

// zstdWindow is the largest window of zstd's standard compression levels
// (1 to 19; only --ultra levels and long-distance mode use more). A frame
// declares its window whatever its size: librdkafka declares 2 MiB for a
// batch of three small messages.
const zstdWindow = 8 << 20

func newBoundedDecompressor(limit int, log *service.Logger) (*boundedDecompressor, error) {
	// The decoder refuses a frame that declares more than its bound (as
	// content size or as window) before decoding it, and stops decoding
	// one that grows past it. It caps the window at that bound too, so
	// the bound is at least zstdWindow; the output is then checked
	// against max. DecodeAll is safe for concurrent use; without a stream
	// to decode it starts no goroutines.
	zd, err := zstd.NewReader(nil,
		zstd.WithDecoderMaxMemory(uint64(max(limit, zstdWindow))),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderConcurrency(0))
	if err != nil {
		return nil, fmt.Errorf("creating the zstd decoder: %w", err)
	}
	return &boundedDecompressor{max: limit, log: log, zstd: zd}, nil
}

var _ kgo.Decompressor = (*boundedDecompressor)(nil)

// Decompress implements kgo.Decompressor.
func (d *boundedDecompressor) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec == kgo.CodecNone {
		return src, nil
	}
	out, err := d.decompress(src, codec)
	if err != nil {
		// The poll loop logs the batch's offsets next; this is the only
		// place that knows why.
		d.log.Warnf("kafka_franz: refusing a record batch of %d bytes: %v", len(src), err)
		return nil, fmt.Errorf("%w: %w", kgo.ErrMaxDecompress, err)
	}
	return out, nil
}

func (d *boundedDecompressor) decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	switch codec {
	case kgo.CodecGzip:
		r, _ := d.gzip.Get().(*gzip.Reader)
		if r == nil {
			r = new(gzip.Reader)
		}
		defer d.gzip.Put(r)
		if err := r.Reset(bytes.NewReader(src)); err != nil {
			return nil, fmt.Errorf("not valid gzip data: %w", err)
		}
		return d.readBounded(r, "gzip")
	case kgo.CodecLz4:
		r, _ := d.lz4.Get().(*lz4.Reader)
		if r == nil {
			r = lz4.NewReader(nil)
		}
		defer d.lz4.Put(r)
		r.Reset(bytes.NewReader(src))
		return d.readBounded(r, "lz4")
	case kgo.CodecSnappy:
		return d.snappy(src)
	case kgo.CodecZstd:
		out, err := d.zstd.DecodeAll(src, nil)
		switch {
		case errors.Is(err, zstd.ErrDecoderSizeExceeded):
			return nil, fmt.Errorf("zstd data decompresses to more than %d bytes", d.max)
		case errors.Is(err, zstd.ErrWindowSizeExceeded):
			limit := max(d.max, zstdWindow)
			var h zstd.Header
			if h.Decode(src) == nil {
				return nil, fmt.Errorf("its zstd window is %d bytes, more than %d", h.WindowSize, limit)
			}
			return nil, fmt.Errorf("its zstd window is more than %d bytes", limit)
		case err != nil:
			return nil, fmt.Errorf("not valid zstd data: %w", err)
		case len(out) > d.max:
			return nil, fmt.Errorf("zstd data decompresses to more than %d bytes", d.max)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("unknown compression codec %d", codec)
	}
}

// readBounded reads r to its end, failing past d.max bytes.
func (d *boundedDecompressor) readBounded(r io.Reader, codec string) ([]byte, error) {
	var out bytes.Buffer
	n, err := out.ReadFrom(io.LimitReader(r, int64(d.max)+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("not valid %s data: %w", codec, err)
	case n > int64(d.max):
		return nil, fmt.Errorf("%s data decompresses to more than %d bytes", codec, d.max)
	}
	return out.Bytes(), nil
}

// xerialPrefix starts the framing Java's snappy stream writes: the magic,
// then two 4-byte versions, then blocks of a 4-byte big-endian length and a
// raw snappy block.
var xerialPrefix = []byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// snappy decodes a raw snappy block, or xerial-framed blocks, checking the
// decoded lengths their headers claim before allocating.
func (d *boundedDecompressor) snappy(src []byte) ([]byte, error) {
	blocks := [][]byte{src}
	if len(src) > 16 && bytes.HasPrefix(src, xerialPrefix) {
		blocks = nil
		for rem := src[16:]; len(rem) > 0; {
			if len(rem) < 4 {
				return nil, errors.New("not valid snappy data: a truncated xerial block length")
			}
			size := binary.BigEndian.Uint32(rem)
			rem = rem[4:]
			if uint64(size) > uint64(len(rem)) {
				return nil, errors.New("not valid snappy data: a xerial block longer than the data")
			}
			blocks, rem = append(blocks, rem[:size]), rem[size:]
		}
	}
	total := 0
	for _, b := range blocks {
		n, err := s2.DecodedLen(b)
		if err != nil {
			return nil, fmt.Errorf("not valid snappy data: %w", err)
		}
		if total += n; total > d.max {
			return nil, fmt.Errorf("snappy data decompresses to more than %d bytes", d.max)
		}
	}
	out := make([]byte, 0, total)
	for _, b := range blocks {
		n, _ := s2.DecodedLen(b)
		dec, err := s2.Decode(out[len(out):len(out)+n], b)
		if err != nil {
			return nil, fmt.Errorf("not valid snappy data: %w", err)
		}
		out = out[:len(out)+len(dec)]
	}
	return out, nil
}
