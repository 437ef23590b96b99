// Package kafkatest runs an in-process Kafka cluster (franz-go's kfake) for
// tests: topics with given partition counts, a producer, and a look at a
// consumer group's committed offsets.
//
//	c := kafkatest.New(t, kafkatest.Topic{Name: "events", Partitions: 3})
//	c.ProduceN(t, "events", 1000, nil)
//	yaml := "seed_brokers: [ " + c.Brokers() + " ]"
//	...
//	offsets := c.Committed(t, "my-group") // map[topic]map[partition]offset
package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/childproc"
)

// MaxMessageBytes is the broker's message.max.bytes in clusters started by
// New: large enough for the 16 MiB messages the product must consume.
const MaxMessageBytes = 32 << 20

// opTimeout bounds every helper call that talks to the cluster.
const opTimeout = 30 * time.Second

// Topic is a topic to create when the cluster starts.
type Topic struct {
	Name       string
	Partitions int32
}

// Cluster is a running in-process Kafka cluster, closed by t.Cleanup.
type Cluster struct {
	*kfake.Cluster

	mu       sync.Mutex
	producer *kgo.Client // default (key hash) partitioner
	manual   *kgo.Client // writes to the partition each record names
	admin    *kadm.Client
}

// New starts a one-broker cluster with the given topics and closes it when
// the test ends. Extra kfake options (kfake.Ports to listen on a fixed port,
// for example) are applied after the defaults.
func New(t testing.TB, topics []Topic, opts ...kfake.Opt) *Cluster {
	t.Helper()
	base := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.BrokerConfigs(map[string]string{
			"message.max.bytes": strconv.Itoa(MaxMessageBytes),
		}),
	}
	kc, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: starting kfake: %v", err)
	}
	c := &Cluster{Cluster: kc}
	t.Cleanup(c.Close)

	if len(topics) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		for _, tp := range topics {
			if _, err := c.Admin(t).CreateTopic(ctx, tp.Partitions, 1, nil, tp.Name); err != nil {
				t.Fatalf("kafkatest: creating topic %q: %v", tp.Name, err)
			}
		}
	}
	return c
}

// Close closes the helper clients and the cluster. It is safe to call more
// than once, so a test may stop the broker early (to simulate an outage).
func (c *Cluster) Close() {
	c.mu.Lock()
	for _, cl := range []**kgo.Client{&c.producer, &c.manual} {
		if *cl != nil {
			(*cl).Close()
			*cl = nil
		}
	}
	if c.admin != nil {
		c.admin.Close()
		c.admin = nil
	}
	kc := c.Cluster
	c.mu.Unlock()
	kc.Close()
}

// Brokers returns the cluster's listen addresses, comma separated, as a
// seed_brokers entry expects them.
func (c *Cluster) Brokers() string { return strings.Join(c.ListenAddrs(), ",") }

// Client returns a new client of the cluster with the given options, closed
// by t.Cleanup.
func (c *Cluster) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ProducerBatchMaxBytes(MaxMessageBytes),
		kgo.BrokerMaxWriteBytes(2 * MaxMessageBytes),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: creating client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CompressingProducer returns a new producer of the cluster, closed by
// t.Cleanup, that compresses every batch with codec, takes records of up to
// maxRecord bytes (franz-go allows up to 1 GiB) and writes each record to the
// partition it names. Each ProduceSync call makes its own batches, so a
// record produced alone is alone in its batch.
func (c *Cluster) CompressingProducer(t testing.TB, codec kgo.CompressionCodec, maxRecord int) *kgo.Client {
	t.Helper()
	batchMax := int32(min(maxRecord+1<<20, 1<<30))
	return c.Client(t,
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerBatchMaxBytes(batchMax),
		kgo.BrokerMaxWriteBytes(batchMax),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
}

// Admin returns a shared admin client of the cluster.
func (c *Cluster) Admin(t testing.TB) *kadm.Client {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admin == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatalf("kafkatest: creating admin client: %v", err)
		}
		c.admin = kadm.NewClient(cl)
	}
	return c.admin
}

func (c *Cluster) producerClient(t testing.TB, manual bool) *kgo.Client {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	slot := &c.producer
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ProducerBatchMaxBytes(MaxMessageBytes),
		kgo.BrokerMaxWriteBytes(2 * MaxMessageBytes),
		kgo.ProducerLinger(0),
	}
	if manual {
		slot = &c.manual
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	if *slot == nil {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatalf("kafkatest: creating producer: %v", err)
		}
		*slot = cl
	}
	return *slot
}

// Produce writes the records synchronously and fails the test on any error.
// A record without a partition set goes to the partition its key hashes to
// (or a sticky one when it has no key).
func (c *Cluster) Produce(t testing.TB, records ...*kgo.Record) {
	t.Helper()
	if len(records) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.producerClient(t, false).ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatalf("kafkatest: producing %d records: %v", len(records), err)
	}
}

// ProduceN writes n records to topic, spread round-robin over its
// partitions. gen builds the record for index i (Topic and Partition are
// then set by ProduceN); nil gives the value "<i>" and no key.
func (c *Cluster) ProduceN(t testing.TB, topic string, n int, gen func(i int) *kgo.Record) {
	t.Helper()
	parts := c.Partitions(t, topic)
	const chunk = 5000
	for start := 0; start < n; start += chunk {
		end := min(start+chunk, n)
		recs := make([]*kgo.Record, 0, end-start)
		for i := start; i < end; i++ {
			var r *kgo.Record
			if gen != nil {
				r = gen(i)
			} else {
				r = &kgo.Record{Value: []byte(strconv.Itoa(i))}
			}
			r.Topic = topic
			r.Partition = int32(i % int(parts))
			recs = append(recs, r)
		}
		c.produceManual(t, recs)
	}
}

// produceManual writes records to the partitions they name.
func (c *Cluster) produceManual(t testing.TB, recs []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.producerClient(t, true).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("kafkatest: producing %d records: %v", len(recs), err)
	}
}

// Partitions returns how many partitions topic has.
func (c *Cluster) Partitions(t testing.TB, topic string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	td, err := c.Admin(t).ListTopics(ctx, topic)
	if err != nil {
		t.Fatalf("kafkatest: listing topic %q: %v", topic, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		t.Fatalf("kafkatest: topic %q not found: %v", topic, d.Err)
	}
	return int32(len(d.Partitions))
}

// Committed returns the committed offsets of group: topic → partition → the
// next offset to consume. Partitions without a commit are absent.
func (c *Cluster) Committed(t testing.TB, group string) map[string]map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := c.Admin(t).FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return map[string]map[int32]int64{} // nothing committed yet
	}
	if err != nil {
		t.Fatalf("kafkatest: fetching offsets of group %q: %v", group, err)
	}
	out := make(map[string]map[int32]int64)
	for topic, ps := range resp {
		for p, o := range ps {
			if o.Err != nil {
				t.Fatalf("kafkatest: offset of %s/%d in group %q: %v", topic, p, group, o.Err)
			}
			if o.At < 0 {
				continue
			}
			if out[topic] == nil {
				out[topic] = make(map[int32]int64)
			}
			out[topic][p] = o.At
		}
	}
	return out
}

// EndOffsets returns topic's high watermarks by partition. A partition the
// broker could not answer for fails the test: its offset would read -1, and
// a test comparing it would fail far from the cause.
func (c *Cluster) EndOffsets(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	lo, err := c.Admin(t).ListEndOffsets(ctx, topic)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		t.Fatalf("kafkatest: listing end offsets of %q: %v", topic, err)
	}
	out := make(map[int32]int64)
	lo.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on right now,
// for a broker that a test starts later (kfake.Ports).
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := childproc.FreePort()
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return port
}

// Addr returns "127.0.0.1:<port>".
func Addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
