package kafka

import (
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/msgmeta"
)

// buildMessages builds the messages of records of one partition, with the
// metadata listed in docs/components.md. A record larger than maxBytes
// becomes an oversized message, and the record lets go of its bytes.
func buildMessages(recs []*kgo.Record, maxBytes int64) []fetched {
	out := make([]fetched, len(recs))
	// Boxed once per call rather than once per message.
	var topic, partition any = recs[0].Topic, int64(recs[0].Partition)
	for i, r := range recs {
		if why := oversizeReason(r, maxBytes); why != "" {
			msg := oversizeMessage(topic, partition, r.Offset, why)
			msg.MetaSetMut(msgmeta.KafkaTimestampMs, r.Timestamp.UnixMilli())
			r.Value, r.Key, r.Headers = nil, nil, nil
			out[i] = fetched{rec: r, msg: msg}
			continue
		}
		out[i] = fetched{rec: r, msg: recordToMessage(r, topic, partition), size: recordSize(r)}
	}
	return out
}

// oversizeReason says why r is too large to deliver, "" when it is not.
func oversizeReason(r *kgo.Record, maxBytes int64) string {
	if n := int64(len(r.Value)); n > maxBytes {
		return fmt.Sprintf("record value is %d bytes, more than max_message_bytes (%d)", n, maxBytes)
	}
	if n := recordSize(r) - int64(len(r.Value)); n > maxBytes {
		return fmt.Sprintf("record key and headers are %d bytes, more than max_message_bytes (%d)", n, maxBytes)
	}
	return ""
}

// refusedBatch stands for a record batch that could not be decompressed
// within its bound (see boundedDecompressor): one oversized message at the batch's first offset, tracked as
// if it were the batch's last record, so that its ack commits the offset
// after the batch (docs/guarantees.md #17). franz-go tells us where the
// batch starts and ends, not what is in it, so its records are accounted
// for by this one message.
func (f *franzInput) refusedBatch(e *kgo.ErrDecompressTooLarge) fetched {
	last := max(e.NextOffset-1, e.Offset)
	extent := fmt.Sprintf("offset %d", e.Offset)
	if last > e.Offset {
		extent = fmt.Sprintf("offsets %d to %d", e.Offset, last)
	}
	why := fmt.Sprintf("record batch at %s does not decompress within %d bytes (%d times max_message_bytes, %d), so none of its records was read",
		extent, batchBytesPerMessage*f.maxMessageBytes, batchBytesPerMessage, f.maxMessageBytes)
	return fetched{
		rec: &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: last, LeaderEpoch: e.Epoch},
		msg: oversizeMessage(e.Topic, int64(e.Partition), e.Offset, why),
	}
}

// oversizeMessage is the empty message that stands for a record, or a
// batch, too large to deliver, with the Kafka coordinates it is stored
// under and the reason.
func oversizeMessage(topic, partition any, offset int64, why string) *service.Message {
	msg := service.NewMessage(nil)
	msg.MetaSetMut(msgmeta.KafkaTopic, topic)
	msg.MetaSetMut(msgmeta.KafkaPartition, partition)
	msg.MetaSetMut(msgmeta.KafkaOffset, offset)
	msgmeta.SetOversize(msg, why)
	return msg
}

// recordToMessage builds the message of a record; a tombstone becomes an
// empty body. topic and partition are the record's, boxed by the caller.
func recordToMessage(r *kgo.Record, topic, partition any) *service.Message {
	msg := service.NewMessage(r.Value)
	for _, h := range r.Headers {
		msg.MetaSetMut(h.Key, string(h.Value))
	}
	if r.Key != nil {
		msg.MetaSetMut(msgmeta.KafkaKey, string(r.Key))
	} else if len(r.Headers) > 0 {
		msg.MetaDelete(msgmeta.KafkaKey)
	}
	if len(r.Headers) > 0 {
		// Only the input says a record was too large.
		msg.MetaDelete(msgmeta.KafkaOversize)
	}
	msg.MetaSetMut(msgmeta.KafkaTopic, topic)
	msg.MetaSetMut(msgmeta.KafkaPartition, partition)
	msg.MetaSetMut(msgmeta.KafkaOffset, r.Offset)
	msg.MetaSetMut(msgmeta.KafkaTimestampMs, r.Timestamp.UnixMilli())
	return msg
}

// withoutMarkers returns the records of one partition that carry data,
// without the transaction markers (control records) among them, and where
// the partition may be committed once they are acked when it ends on a
// marker: the offset after that marker. marker.Offset is -1 when the last
// record is data: its own ack moves the commit point far enough. recs is
// reused.
func withoutMarkers(recs []*kgo.Record) (data []*kgo.Record, marker kgo.EpochOffset) {
	marker = kgo.EpochOffset{Epoch: -1, Offset: -1}
	data = recs[:0]
	for _, r := range recs {
		if r.Attrs.IsControl() {
			marker = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
			continue
		}
		data = append(data, r)
		marker.Offset = -1
	}
	return data, marker
}
