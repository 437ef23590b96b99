package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// The two benchmarks consume the same data (benchRecords camera-sized JSON
// records on 3 partitions of an in-process kfake broker) with a fresh
// consumer group per iteration, and report records/s and the process's CPU
// time per record (steadier than wall time on a shared machine). Compare
// them with
//
//	go test ./plugins/kafka -run '^$' -bench 'BenchmarkKafkaFranzInput|BenchmarkBareFranzGo' -count 5
const benchRecords = 100_000

var benchPayload = []byte(`{"messageId":"8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11","deviceId":"CAM-0001","parkCode":"P1001","berthCode":"B-012","itemId":73421,"plateNo":"B12345","plateColor":1,"inoutType":1,"inoutTime":1779330600000,"plateCredible":0.854,"pictures":[{"picType":1,"picUrl":"jieshun/2026/05/21/P1001/a.jpg"}]}`)

// cpuTime is the CPU time (user + system) the process has used: on a shared
// machine it measures the work per record better than wall time does. It
// includes the in-process broker, whose work is the same in both
// benchmarks.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportRates(b *testing.B, cpuStart time.Duration) {
	records := float64(benchRecords * b.N)
	b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64((cpuTime(b)-cpuStart).Nanoseconds())/records, "cpu-ns/record")
}

func benchCluster(b *testing.B) *kafkatest.Cluster {
	b.Helper()
	c := kafkatest.New(b, []kafkatest.Topic{{Name: "bench", Partitions: 3}})
	c.ProduceN(b, "bench", benchRecords, func(int) *kgo.Record { return &kgo.Record{Value: benchPayload} })
	return c
}

// BenchmarkKafkaFranzInput measures kafka_franz → a consumer that drops
// every batch, through a real Benthos stream, including group join, acks
// and commits.
func BenchmarkKafkaFranzInput(b *testing.B) {
	c := benchCluster(b)
	b.ResetTimer()
	cpu := cpuTime(b)
	for i := range b.N {
		var got atomic.Int64
		done := make(chan struct{})
		sb := service.NewStreamBuilder()
		sb.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
		err := sb.AddInputYAML(fmt.Sprintf(`
kafka_franz:
  seed_brokers: [ %q ]
  topics: [ bench ]
  consumer_group: bench-input-%d
`, c.Brokers(), i))
		if err != nil {
			b.Fatal(err)
		}
		err = sb.AddBatchConsumerFunc(func(_ context.Context, batch service.MessageBatch) error {
			if got.Add(int64(len(batch))) == benchRecords {
				close(done)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		stream, err := sb.Build()
		if err != nil {
			b.Fatal(err)
		}
		stopped := make(chan struct{})
		go func() {
			_ = stream.Run(context.Background())
			close(stopped)
		}()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			b.Fatalf("consumed %d of %d records", got.Load(), benchRecords)
		}
		b.StopTimer()
		stopCPU := cpuTime(b)
		_ = stream.StopWithin(10 * time.Second)
		<-stopped
		cpu += cpuTime(b) - stopCPU
		b.StartTimer()
	}
	reportRates(b, cpu)
}

// BenchmarkBareFranzGo is the baseline: a plain franz-go group consumer
// that polls and counts the same records and commits them at the end.
func BenchmarkBareFranzGo(b *testing.B) {
	c := benchCluster(b)
	b.ResetTimer()
	cpu := cpuTime(b)
	for i := range b.N {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(c.ListenAddrs()...),
			kgo.ConsumerGroup(fmt.Sprintf("bench-bare-%d", i)),
			kgo.ConsumeTopics("bench"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(),
		)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		n := 0
		for n < benchRecords {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				b.Fatalf("consumed %d of %d records", n, benchRecords)
			}
			fs.EachRecord(func(*kgo.Record) { n++ })
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		b.StopTimer()
		stopCPU := cpuTime(b)
		cl.Close()
		cpu += cpuTime(b) - stopCPU
		b.StartTimer()
	}
	reportRates(b, cpu)
}
