package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/pluginconf"
)

const (
	kfoFieldTopic           = "topic"
	kfoFieldKey             = "key"
	kfoFieldPartition       = "partition"
	kfoFieldMetadata        = "metadata"
	kfoFieldMaxInFlight     = "max_in_flight"
	kfoFieldBatching        = "batching"
	kfoFieldMaxMessageBytes = "max_message_bytes"
	kfoFieldTimeout         = "timeout"
	kfoFieldCompression     = "compression"

	// minRecordBatchBytes is the least ProducerBatchMaxBytes franz-go
	// accepts.
	minRecordBatchBytes = 512
)

// compressionCodecs are the values of compression.
var compressionCodecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

var franzOutputSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Services").
		Summary("Writes messages to Kafka with an idempotent producer, waiting for every in-sync replica.").
		Description(`
Built on [franz-go](https://github.com/twmb/franz-go). Each message becomes one record: the body is the value, `+"`key`"+` and `+"`partition`"+` are computed per message, and the metadata keys selected by `+"`metadata`"+` become record headers.

Writes use `+"`acks=all`"+` and the idempotent producer, so a retried write never duplicates or reorders records within a partition. A batch is acknowledged only once every record of it is written; records that fail are rejected individually, so the input can retry just those.

Used for the optional dead-letter topic and by the dev stack's event generator.`).
		Fields(
			seedBrokersField(),
			service.NewInterpolatedStringField(kfoFieldTopic).
				Description("The topic to write each message to.").
				Examples("forwarder-dead-letter", `${! @kafka_topic }-dlq`),
			service.NewInterpolatedStringField(kfoFieldKey).
				Description("The record key. Records with the same key go to the same partition (unless `partition` is set). Leave unset for no key.").
				Example(`${! json("messageId") }`).
				Optional(),
			service.NewInterpolatedStringField(kfoFieldPartition).
				Description("Writes each record to this partition number instead of the one its key hashes to. Must interpolate to an integer.").
				Example(`${! @kafka_partition }`).
				Optional().
				Advanced(),
			service.NewMetadataFilterField(kfoFieldMetadata).
				Description("Which metadata keys are written as record headers. By default none are.").
				Optional(),
			clientIDField(),
			metadataMaxAgeField(),
			service.NewIntField(kfoFieldMaxInFlight).
				Description("The most batches written at the same time, from 1 to 10000 (Benthos starts a goroutine for each).").
				Default(10).
				LintRule(outputMaxInFlightLintRule),
			service.NewBatchPolicyField(kfoFieldBatching),
			service.NewStringField(kfoFieldMaxMessageBytes).
				Description("The largest record batch the producer builds (Kafka's `max.message.bytes` on the producer side); a single message larger than this is rejected. It must not exceed the broker's or topic's `max.message.bytes`. From `512B` to `1GiB`, what franz-go builds.").
				Default("1MiB").
				LintRule(outputMaxMessageBytesLintRule).
				Advanced(),
			service.NewDurationField(kfoFieldTimeout).
				Description("How long a batch may take to be written before it is rejected (and retried by the input).").
				Default("10s").
				LintRule(positiveLintRule(kfoFieldTimeout)).
				Advanced(),
			service.NewStringEnumField(kfoFieldCompression, compressionCodecs...).
				Description("Compression of record batches.").
				Default("none").
				LintRule(compressionLintRule(compressionCodecs)).
				Advanced(),
			tlsField(),
			saslField(),
		).
		Example("Dead-letter topic", "Writes rejected messages to a topic next to their source, keeping the source's coordinates as headers.", `
output:
  kafka_franz:
    seed_brokers: [ "${KAFKA_BROKERS:localhost:9092}" ]
    topic: '${! @kafka_topic }-dlq'
    key: '${! @kafka_key }'
    metadata:
      include_prefixes: [ "kafka_" ]
    max_in_flight: 10
    batching:
      count: 100
      period: 100ms
`)
})

// parseOutputFlow reads what Benthos runs the output with: its batching
// policy and how many batches may be written at once.
func parseOutputFlow(conf *service.ParsedConfig) (service.BatchPolicy, int, error) {
	var err error
	policy := pluginconf.Field(&err, conf.FieldBatchPolicy, kfoFieldBatching)
	maxInFlight := pluginconf.Field(&err, conf.FieldInt, kfoFieldMaxInFlight)
	if err != nil {
		return service.BatchPolicy{}, 0, err
	}
	if err := checkOutputMaxInFlight(maxInFlight); err != nil {
		return service.BatchPolicy{}, 0, err
	}
	return policy, maxInFlight, nil
}

func init() {
	service.MustRegisterBatchOutput("kafka_franz", franzOutputSpec(),
		func(conf *service.ParsedConfig, res *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			out, err := newFranzOutputFromParsed(conf, res)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			policy, maxInFlight, err := parseOutputFlow(conf)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			return out, policy, maxInFlight, nil
		})
}

type franzOutput struct {
	log        *service.Logger
	clientOpts []kgo.Opt
	outage     *outageLogger

	topic     *service.InterpolatedString
	key       *service.InterpolatedString // nil: no key
	partition *service.InterpolatedString // nil: partition by key
	meta      *service.MetadataFilter     // nil: no headers
	timeout   time.Duration

	mu     sync.RWMutex
	client *kgo.Client
}

func newFranzOutputFromParsed(conf *service.ParsedConfig, res *service.Resources) (*franzOutput, error) {
	opts, err := parseCommonOpts(conf)
	if err != nil {
		return nil, err
	}
	o := &franzOutput{log: res.Logger()}
	o.outage = newOutageLogger(o.log)

	o.topic = pluginconf.Field(&err, conf.FieldInterpolatedString, kfoFieldTopic)
	if conf.Contains(kfoFieldKey) {
		o.key = pluginconf.Field(&err, conf.FieldInterpolatedString, kfoFieldKey)
	}
	if conf.Contains(kfoFieldPartition) {
		o.partition = pluginconf.Field(&err, conf.FieldInterpolatedString, kfoFieldPartition)
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	if conf.Contains(kfoFieldMetadata) {
		o.meta = pluginconf.Field(&err, conf.FieldMetadataFilter, kfoFieldMetadata)
	}
	o.timeout = pluginconf.Field(&err, conf.FieldDuration, kfoFieldTimeout)
	comp := pluginconf.Field(&err, conf.FieldString, kfoFieldCompression)
	if err != nil {
		return nil, err
	}
	if err := checkPositive(kfoFieldTimeout)(o.timeout); err != nil {
		return nil, err
	}
	maxBytes, err := parseBrokerIOSize(conf, kfoFieldMaxMessageBytes)
	if err != nil {
		return nil, err
	}
	if err := checkRecordBatchBytes(int64(maxBytes)); err != nil {
		return nil, err
	}
	var codec kgo.CompressionCodec
	switch comp {
	case "none":
		codec = kgo.NoCompression()
	case "gzip":
		codec = kgo.GzipCompression()
	case "snappy":
		codec = kgo.SnappyCompression()
	case "lz4":
		codec = kgo.Lz4Compression()
	case "zstd":
		codec = kgo.ZstdCompression()
	default:
		return nil, unknownCodec(comp)
	}

	o.clientOpts = append(opts,
		// acks=all plus the idempotent producer (franz-go's default,
		// stated here because the guarantee depends on it): retries
		// neither duplicate nor reorder records.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(maxBytes),
		kgo.BrokerMaxWriteBytes(brokerIOBytes(maxBytes)),
		kgo.ProducerBatchCompression(codec),
		kgo.WithLogger(kgoLogger{log: o.log}),
		kgo.WithHooks(o.outage),
	)
	return o, nil
}

// Connect creates the producer and waits until a broker answers, retrying
// with backoff (the outage is logged once).
func (o *franzOutput) Connect(ctx context.Context) error {
	o.mu.RLock()
	connected := o.client != nil
	o.mu.RUnlock()
	if connected {
		return nil
	}
	cl, err := reachableClient(ctx, o.clientOpts, o.log, o.outage)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.client = cl
	o.mu.Unlock()
	return nil
}

// WriteBatch writes every message as a record and waits for all of them.
// Messages that fail (to interpolate or to be written) are reported
// individually, so only they are retried.
func (o *franzOutput) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	o.mu.RLock()
	cl := o.client
	o.mu.RUnlock()
	if cl == nil {
		return service.ErrNotConnected
	}

	var batchErr *service.BatchError
	fail := func(i int, err error) {
		if batchErr == nil {
			batchErr = service.NewBatchError(batch, err)
		}
		batchErr = batchErr.Failed(i, err)
	}

	records := make([]*kgo.Record, 0, len(batch))
	index := make(map[*kgo.Record]int, len(batch))
	for i, msg := range batch {
		r, err := o.toRecord(batch, i, msg)
		if err != nil {
			fail(i, err)
			continue
		}
		records = append(records, r)
		index[r] = i
	}

	if len(records) > 0 {
		ctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		var recreated []string
		for _, res := range cl.ProduceSync(ctx, records...) {
			if res.Err != nil {
				fail(index[res.Record], fmt.Errorf("writing to %s: %w", res.Record.Topic, res.Err))
				if errors.Is(res.Err, kerr.UnknownTopicID) && !slices.Contains(recreated, res.Record.Topic) {
					recreated = append(recreated, res.Record.Topic)
				}
			}
		}
		o.forgetRecreated(cl, recreated)
	}
	if batchErr != nil {
		return batchErr
	}
	return nil
}

// forgetRecreated purges topics from the producer. franz-go answers
// UNKNOWN_TOPIC_ID for a topic deleted and created again under its name
// (it keeps the ID it first saw) until the topic is purged, after which the
// next write goes to the new topic; without it every retry of the messages
// would fail the same way, for good.
func (o *franzOutput) forgetRecreated(cl *kgo.Client, topics []string) {
	if len(topics) == 0 {
		return
	}
	o.log.Warnf("kafka_franz: topic %s was deleted and created again: the messages that failed are written to the new topic when retried", strings.Join(topics, ", "))
	cl.PurgeTopicsFromClient(topics...)
}

func (o *franzOutput) toRecord(batch service.MessageBatch, i int, msg *service.Message) (*kgo.Record, error) {
	topic, err := batch.TryInterpolatedString(i, o.topic)
	if err != nil {
		return nil, fmt.Errorf("interpolating %s: %w", kfoFieldTopic, err)
	}
	if topic == "" {
		return nil, fmt.Errorf("field %s interpolated to an empty topic", kfoFieldTopic)
	}
	value, err := msg.AsBytes()
	if err != nil {
		return nil, fmt.Errorf("reading message body: %w", err)
	}
	r := &kgo.Record{Topic: topic, Value: value}
	if o.key != nil {
		if r.Key, err = batch.TryInterpolatedBytes(i, o.key); err != nil {
			return nil, fmt.Errorf("interpolating %s: %w", kfoFieldKey, err)
		}
	}
	if o.partition != nil {
		s, err := batch.TryInterpolatedString(i, o.partition)
		if err != nil {
			return nil, fmt.Errorf("interpolating %s: %w", kfoFieldPartition, err)
		}
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("field %s: %q is not a partition number", kfoFieldPartition, s)
		}
		r.Partition = int32(p)
	}
	if o.meta != nil {
		_ = o.meta.Walk(msg, func(k, v string) error {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			return nil
		})
	}
	return r, nil
}

// Close flushes nothing (writes are synchronous) and closes the producer.
func (o *franzOutput) Close(context.Context) error {
	o.mu.Lock()
	cl := o.client
	o.client = nil
	o.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	return nil
}
