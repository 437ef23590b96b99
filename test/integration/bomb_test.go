package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestDecompressionBombBecomesAFailedRow runs the ingest half of
// pipelines/forwarder.yaml, kafka_franz → outbox (persist only), with
// max_message_bytes and max_payload_bytes of 1 MiB, over a partition whose
// second batch is 64 MiB of zeros compressed with zstd and another where it
// is compressed with gzip, each between ordinary messages, both as
// franz-go's producer compresses them (docs/guarantees.md #17). Each bomb becomes one FAILED
// row under its fallback key, with no payload and a reason naming the bound;
// every ordinary message has its PENDING row, and the group's offsets reach
// the end of both partitions.
func TestDecompressionBombBecomesAFailedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		topic    = "device-vehicle-event"
		group    = "forwarder"
		bombSize = 64 << 20
		before   = 10
		after    = 100
	)
	dsn := pgtest.NewDB(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	kc := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 2}})
	bombAt := map[int32]int64{}
	for partition, codec := range []struct {
		producer kgo.CompressionCodec
		bomb     kafkatest.Codec
	}{
		{kgo.ZstdCompression().WithLevel(1), kafkatest.Zstd},
		{kgo.GzipCompression().WithLevel(1), kafkatest.Gzip},
	} {
		p := int32(partition)
		producer := kc.CompressingProducer(t, codec.producer, 1<<20)
		produce := func(recs ...*kgo.Record) {
			t.Helper()
			pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if err := producer.ProduceSync(pctx, recs...).FirstErr(); err != nil {
				t.Fatalf("producing to partition %d: %v", p, err)
			}
		}
		ordinary := func(from, to int) []*kgo.Record {
			var recs []*kgo.Record
			for i := from; i < to; i++ {
				recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: vehicle(fmt.Sprintf("p%d-%03d", p, i))})
			}
			return recs
		}
		produce(ordinary(0, before)...)
		bombAt[p] = kc.ProduceBomb(t, topic, p, bombSize, codec.bomb)
		produce(ordinary(before, before+after)...)
	}

	logs := &logbuf.Buffer{}
	conf := fmt.Sprintf(`
http:
  enabled: false
input:
  kafka_franz:
    seed_brokers: [ %q ]
    topics: [ %q ]
    consumer_group: %q
    commit_period: 100ms
    max_message_bytes: 1MiB
  processors:
    - outbox:
        dsn: %q
        api_types:
          %s: VEHICLE_EVENT
        emit: none
        max_payload_bytes: 1048576
output:
  drop: {}
metrics:
  none: {}
shutdown_timeout: 20s
`, kc.Brokers(), topic, group, dsn, topic)
	startStream(t, logs, slog.LevelInfo, conf)

	const perPartition = before + 1 + after
	waitFor(t, "the commits of both partitions, bombs included", func() bool {
		got := kc.Committed(t, group)[topic]
		return got[0] == perPartition && got[1] == perPartition
	})

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE status = 'PENDING'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2*(before+after) {
		t.Errorf("%d PENDING rows, want one per ordinary message: %d", n, 2*(before+after))
	}
	for p, offset := range bombAt {
		key := fmt.Sprintf("%s-%d-%d", topic, p, offset)
		var (
			status, lastError string
			payload           int
		)
		err := pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), length(payload) FROM forward_records WHERE message_key = $1`, key).
			Scan(&status, &lastError, &payload)
		if err != nil {
			t.Errorf("the bomb of partition %d (%s): %v", p, key, err)
			continue
		}
		want := fmt.Sprintf("payload not stored: record batch at offset %d does not decompress within %d bytes", offset, 4<<20)
		if status != "FAILED" || !strings.HasPrefix(lastError, want) || payload != 0 {
			t.Errorf("the bomb of partition %d: %s, %q, %d payload bytes; want FAILED, %q..., none", p, status, lastError, payload, want)
		}
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 2*perPartition {
		t.Errorf("%d rows, want %d: one per record", total, 2*perPartition)
	}
}
