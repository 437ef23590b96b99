package outbox

import (
	cryptorand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

func validAPIType(t string) bool {
	return t == outboxdb.APITypeVehicleEvent || t == outboxdb.APITypeHeartbeat
}

// record turns message i into its row: key, API type, Kafka coordinates,
// payload and, for a message that cannot be forwarded, status FAILED with the
// reasons.
func (p *outboxProcessor) record(i int, msg *service.Message, keyExec, typeExec *service.MessageBatchInterpolationExecutor) outboxdb.NewRecord {
	var reasons []string
	payload, err := msg.AsBytes()
	if err != nil {
		payload, reasons = nil, append(reasons, fmt.Sprintf("payload could not be read: %v", err))
	}
	k, haveCoords := msgmeta.ReadKafka(msg)
	topic, partition, offset := storableTopic(k.Topic), k.Partition, k.Offset
	rec := outboxdb.NewRecord{
		KafkaTopic:     topic,
		KafkaPartition: partition,
		KafkaOffset:    offset,
		KafkaKey:       k.Key,
		Payload:        payload,
		Status:         outboxdb.StatusPending,
	}
	payloadOK := err == nil
	if why, oversize := msgmeta.Oversize(msg); oversize {
		// The input never read the record whole (docs/guarantees.md #17):
		// there is no payload to store, only why.
		rec.Payload = nil
		reasons, payloadOK = append(reasons, "payload not stored: "+why), false
	}
	var m members
	if payloadOK {
		var why string
		if why, m = inspectPayload(payload, p.maxPayload); why != "" {
			reasons, payloadOK = append(reasons, why), false
		}
	}
	rec.PlateNo = m[memberPlateNo].lookup()
	rec.ParkCode = m[memberParkCode].lookup()
	rec.BerthCode = m[memberBerthCode].lookup()
	rec.DeviceID = m[memberDeviceID].lookup()

	// The key.
	var key, missing string
	if keyExec != nil {
		k, err := keyExec.TryString(i)
		switch {
		case err != nil:
			missing = fmt.Sprintf("key could not be evaluated: %v", err)
		case k == "":
			missing = "key is empty"
		default:
			key = k
		}
	} else if payloadOK {
		if k, ok, why := m[memberMessageID].key(); ok {
			key = k
		} else {
			missing = why
		}
	}
	if key != "" {
		if err := outboxdb.CheckKey(key); err != nil {
			reasons = append(reasons, fmt.Sprintf("message key is unusable: %v", err))
			key = ""
		}
	}
	if key == "" {
		key = fallbackKey(topic, partition, offset, haveCoords)
		if missing != "" {
			p.mMissingID.Incr(1)
			p.log.Warnf("Message at %s has %s; persisting it under the fallback key %q", coordinates(topic, partition, offset), missing, key)
		}
	}
	rec.MessageKey = key

	// The API type.
	if typeExec != nil {
		t, err := typeExec.TryString(i)
		switch {
		case err != nil:
			reasons = append(reasons, fmt.Sprintf("api_type could not be evaluated: %v", err))
		case !validAPIType(t):
			reasons = append(reasons, fmt.Sprintf("api_type evaluated to %q, want %s or %s", t, outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat))
		default:
			rec.APIType = t
		}
	} else if t, ok := p.apiTypes[topic]; ok {
		rec.APIType = t
	} else {
		reasons = append(reasons, fmt.Sprintf("kafka_topic %q has no entry in api_types", topic))
	}
	if rec.APIType == "" {
		rec.APIType = apiTypeUnknown
	}

	if len(reasons) > 0 {
		rec.Status = outboxdb.StatusFailed
		rec.LastError = strings.Join(reasons, "; ")
	}
	if p.orderBerth && rec.Status == outboxdb.StatusPending && rec.APIType == outboxdb.APITypeVehicleEvent &&
		rec.ParkCode != "" && rec.BerthCode != "" {
		rec.OrderingKey = rec.ParkCode + "/" + rec.BerthCode
	}
	return rec
}

// storableTopic makes a topic name storable as text: invalid UTF-8 and NUL
// characters (which PostgreSQL rejects, failing the whole batch) are
// replaced or dropped.
func storableTopic(topic string) string {
	if !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0 {
		topic = strings.ReplaceAll(strings.ToValidUTF8(topic, "\uFFFD"), "\x00", "")
	}
	return topic
}

// fallbackKey is <topic>-<partition>-<offset>, stable across redeliveries of
// one Kafka record. Without Kafka coordinates there is nothing stable to key
// on, and a shared constant would merge unrelated messages into one row, so
// each message gets a random key instead.
func fallbackKey(topic string, partition int32, offset int64, haveCoords bool) string {
	if haveCoords {
		return coordinates(topic, partition, offset)
	}
	var b [16]byte
	_, _ = cryptorand.Read(b[:])
	return "no-kafka-coordinates-" + hex.EncodeToString(b[:])
}

// keyedByCoordinates says whether r's key is its Kafka coordinates (the
// fallback key), without building them for the messages keyed by their
// messageId, which every batch is full of.
func keyedByCoordinates(r *outboxdb.NewRecord) bool {
	rest, ok := strings.CutPrefix(r.MessageKey, r.KafkaTopic)
	return ok && strings.HasPrefix(rest, "-") && r.MessageKey == coordinates(r.KafkaTopic, r.KafkaPartition, r.KafkaOffset)
}

// reusedCoordinatesKey is the key of a message keyed by its Kafka
// coordinates when they already key an earlier message (see
// keyReusedCoordinatesApart): <topic>-<partition>-<offset>~ and the first 16
// hex digits of its payload's SHA-256. '~' is not a character of Kafka
// topic names, so no coordinates read as such a key.
func reusedCoordinatesKey(coords string, payload []byte) string {
	sum := sha256.Sum256(payload)
	return coords + "~" + hex.EncodeToString(sum[:8])
}

func coordinates(topic string, partition int32, offset int64) string {
	return topic + "-" + strconv.FormatInt(int64(partition), 10) + "-" + strconv.FormatInt(offset, 10)
}
