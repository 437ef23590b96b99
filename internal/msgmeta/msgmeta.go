// Package msgmeta is the contract between the components of the data path:
// the metadata each one sets on a message and the next one reads. Nobody
// else spells a key.
//
//	kafka_franz ──Kafka──► outbox (stores, passes nothing on)
//	outbox_retry ──Claim──► mapping ──► http_forwarder
//	outbox_dead_letter ──Failed──► kafka_franz output
//
// Keys are part of the user-facing interface too: mappings and interpolations
// read them with meta("kafka_topic") or @api_type (docs/reference).
package msgmeta

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Keys set by the kafka_franz input, besides one per record header.
const (
	KafkaTopic       = "kafka_topic"
	KafkaPartition   = "kafka_partition"
	KafkaOffset      = "kafka_offset"
	KafkaKey         = "kafka_key"
	KafkaTimestampMs = "kafka_timestamp_ms"
	// KafkaOversize is set, instead of a body, on a message that stands for
	// a record (or a compressed record batch) too large to deliver; its
	// value says why and names the sizes (docs/guarantees.md #17).
	KafkaOversize = "kafka_oversize"
)

// Keys of an outbox row, set by the outbox_retry input and the
// outbox_dead_letter input.
const (
	OutboxID         = "outbox_id"
	MessageKey       = "message_key"
	APIType          = "api_type"
	Attempt          = "attempt"
	ClaimToken       = "claim_token"
	CreatedAtMs      = "outbox_created_at_ms"
	LeaseExpiresAtMs = "lease_expires_at_ms"
	// PreviousFailureAtMs is when an attempt last failed for the row (on
	// any instance), rounded up to the millisecond; absent when it has not
	// failed since it was stored or last requeued.
	PreviousFailureAtMs = "previous_failure_at_ms"
	LastError           = "last_error"
	LastHTTPStatus      = "last_http_status"
	AttemptCount        = "attempt_count"
	FailedAtMs          = "failed_at_ms"
)

// Kafka is where a message was read.
type Kafka struct {
	Topic     string
	Partition int32
	Offset    int64
	// Key is the record key; nil when the record has none.
	Key         []byte
	TimestampMs int64
}

// SetKafka sets the Kafka metadata of msg. Partition, offset and timestamp
// are integers, topic and key strings (a key that is absent is not set).
func SetKafka(msg *service.Message, k Kafka) {
	if k.Key != nil {
		msg.MetaSetMut(KafkaKey, string(k.Key))
	}
	msg.MetaSetMut(KafkaTopic, k.Topic)
	msg.MetaSetMut(KafkaPartition, int64(k.Partition))
	msg.MetaSetMut(KafkaOffset, k.Offset)
	msg.MetaSetMut(KafkaTimestampMs, k.TimestampMs)
}

// ReadKafka reads the Kafka metadata of msg, whether set as integers or as
// decimal text. ok is false when the topic, partition or offset is missing
// or unreadable (the message did not come from kafka_franz); partition and
// offset are then -1. Key is nil when the metadata is absent.
func ReadKafka(msg *service.Message) (k Kafka, ok bool) {
	topic, okTopic := msg.MetaGet(KafkaTopic)
	part, okPart := Int(msg, KafkaPartition)
	off, okOff := Int(msg, KafkaOffset)
	if !okPart || part < 0 || part > 1<<31-1 {
		part, okPart = -1, false
	}
	if !okOff {
		off = -1
	}
	k = Kafka{Topic: topic, Partition: int32(part), Offset: off}
	k.TimestampMs, _ = Int(msg, KafkaTimestampMs)
	if v, found := msg.MetaGetMut(KafkaKey); found {
		switch key := v.(type) {
		case []byte:
			k.Key = key
		case string:
			k.Key = []byte(key)
		default:
			s, _ := msg.MetaGet(KafkaKey)
			k.Key = []byte(s)
		}
	}
	return k, okTopic && topic != "" && okPart && okOff
}

// SetOversize marks msg as standing for a record, or a record batch, that
// was not delivered because of its size; why names the sizes.
func SetOversize(msg *service.Message, why string) {
	msg.MetaSetMut(KafkaOversize, why)
}

// Oversize returns why msg stands for a record that was too large to
// deliver; ok is false for an ordinary message.
func Oversize(msg *service.Message) (why string, ok bool) {
	why, ok = msg.MetaGet(KafkaOversize)
	return why, ok && why != ""
}

// setRow sets the metadata of the outbox row c: its id, key, API type,
// where its message was read (the key always, empty when it had none) and
// when it was stored.
func setRow(msg *service.Message, c Claim) {
	msg.MetaSetMut(OutboxID, c.ID)
	msg.MetaSetMut(MessageKey, c.MessageKey)
	msg.MetaSetMut(APIType, c.APIType)
	msg.MetaSetMut(KafkaTopic, c.Kafka.Topic)
	msg.MetaSetMut(KafkaPartition, int64(c.Kafka.Partition))
	msg.MetaSetMut(KafkaOffset, c.Kafka.Offset)
	msg.MetaSetMut(KafkaKey, string(c.Kafka.Key))
	msg.MetaSetMut(CreatedAtMs, c.CreatedAt.UnixMilli())
}

// Claim is one claim of one outbox row, as the dispatcher hands it down the
// pipeline: the output needs it to send the row and to write its result,
// fenced by the claim token.
type Claim struct {
	ID         int64
	MessageKey string
	APIType    string
	// Attempt is this attempt's number, 1-based, already counted.
	Attempt int
	Token   string
	Kafka   Kafka
	// CreatedAt is when the row was persisted (end-to-end latency); zero
	// when unknown.
	CreatedAt time.Time
	// LeaseExpiresAt is the claim's lease deadline when it was handed out;
	// zero when unknown. The dispatcher renews leases of rows it holds, so
	// the output asks it for the current one.
	LeaseExpiresAt time.Time
	// PreviousFailure is when an attempt last failed for the row, on
	// whichever instance made it; zero when it has not failed since it was
	// stored or last requeued.
	// The platform's protection counts the row's next failure only once
	// the platform has answered a request sent after that one.
	PreviousFailure time.Time
}

// ClaimOf is the claim of r, a row as the claim returns it.
func ClaimOf(r outboxdb.Record) Claim {
	c := Claim{
		ID: r.ID, MessageKey: r.MessageKey, APIType: r.APIType, Attempt: r.AttemptCount, Token: r.ClaimToken,
		Kafka:     Kafka{Topic: r.KafkaTopic, Partition: r.KafkaPartition, Offset: r.KafkaOffset, Key: r.KafkaKey},
		CreatedAt: r.CreatedAt, LeaseExpiresAt: r.LeaseExpiresAt(),
	}
	if r.PreviousFailureAt != nil {
		c.PreviousFailure = *r.PreviousFailureAt
	}
	return c
}

// SetClaim sets the claim metadata (and the row's Kafka origin) of msg.
func SetClaim(msg *service.Message, c Claim) {
	setRow(msg, c)
	msg.MetaSetMut(Attempt, int64(c.Attempt))
	msg.MetaSetMut(ClaimToken, c.Token)
	msg.MetaSetMut(LeaseExpiresAtMs, c.LeaseExpiresAt.UnixMilli())
	if !c.PreviousFailure.IsZero() {
		// Rounded up: read back, it is never earlier than the failure.
		msg.MetaSetMut(PreviousFailureAtMs, c.PreviousFailure.Add(time.Millisecond-time.Nanosecond).UnixMilli())
	}
}

// claimKeys are the keys SetClaim sets.
var claimKeys = [...]string{
	OutboxID, MessageKey, APIType, KafkaTopic, KafkaPartition, KafkaOffset, KafkaKey, CreatedAtMs,
	Attempt, ClaimToken, LeaseExpiresAtMs, PreviousFailureAtMs,
}

// KeepClaim gives mapped back the claim metadata of orig that a mapping
// removed (meta = deleted() is a common way to keep metadata out of a
// request). The claim is the dispatcher's, not the mapping's: without it the
// output cannot name the row to record a result for. A key the mapping set
// to another value keeps that value; a message that carries no claim (a
// dead-lettered row, a Kafka record) is left alone.
func KeepClaim(orig, mapped *service.Message) {
	if _, ok := orig.MetaGetMut(ClaimToken); !ok {
		return
	}
	for _, key := range claimKeys {
		if _, ok := mapped.MetaGetMut(key); ok {
			continue
		}
		if v, ok := orig.MetaGetMut(key); ok {
			mapped.MetaSetMut(key, v)
		}
	}
}

// ReadClaim reads the claim a message carries. The id, token and attempt
// are required: a message without them was not handed out by the
// dispatcher, and its result could not be recorded.
func ReadClaim(msg *service.Message) (Claim, error) {
	var c Claim
	required := func(key string) (string, error) {
		v, ok := msg.MetaGet(key)
		if !ok || v == "" {
			return "", fmt.Errorf("metadata %s is missing: http_forwarder must be fed by the outbox_retry input, and no processor may remove its metadata (meta = deleted() in a mapping or bloblang processor; mapping_file keeps it)", key)
		}
		return v, nil
	}
	id, err := required(OutboxID)
	if err != nil {
		return c, err
	}
	if c.ID, err = strconv.ParseInt(id, 10, 64); err != nil {
		return c, fmt.Errorf("metadata %s: %q is not an integer", OutboxID, id)
	}
	if c.Token, err = required(ClaimToken); err != nil {
		return c, err
	}
	attempt, err := required(Attempt)
	if err != nil {
		return c, err
	}
	n, err := strconv.ParseInt(attempt, 10, 64)
	if err != nil {
		return c, fmt.Errorf("metadata %s: %q is not an integer", Attempt, attempt)
	}
	if n < 1 {
		return c, fmt.Errorf("metadata %s: %d is not a 1-based attempt number", Attempt, n)
	}
	c.Attempt = int(n)
	c.APIType, _ = msg.MetaGet(APIType)
	c.MessageKey, _ = msg.MetaGet(MessageKey)
	c.Kafka, _ = ReadKafka(msg)
	for key, into := range map[string]*time.Time{
		CreatedAtMs: &c.CreatedAt, LeaseExpiresAtMs: &c.LeaseExpiresAt, PreviousFailureAtMs: &c.PreviousFailure,
	} {
		v, ok := msg.MetaGet(key)
		if !ok || v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return c, fmt.Errorf("metadata %s: %q is not an integer", key, v)
		}
		*into = time.UnixMilli(ms)
	}
	return c, nil
}

// Failed describes a FAILED row published to a dead-letter topic.
type Failed struct {
	Claim
	LastError string
	// LastHTTPStatus is the status of the last reply; 0 when there was none.
	LastHTTPStatus int
	AttemptCount   int
	FailedAt       time.Time
}

// SetFailed sets the metadata of a dead-lettered row.
func SetFailed(msg *service.Message, f Failed) {
	setRow(msg, f.Claim)
	msg.MetaSetMut(LastError, f.LastError)
	if f.LastHTTPStatus != 0 {
		msg.MetaSetMut(LastHTTPStatus, int64(f.LastHTTPStatus))
	}
	msg.MetaSetMut(AttemptCount, int64(f.AttemptCount))
	msg.MetaSetMut(FailedAtMs, f.FailedAt.UnixMilli())
}

// Int reads an integer metadata value, set either as a number or as its
// decimal text.
func Int(msg *service.Message, key string) (int64, bool) {
	v, ok := msg.MetaGetMut(key)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint64:
		return int64(n), n <= 1<<63-1
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		return i, err == nil
	default:
		s, _ := msg.MetaGet(key)
		i, err := strconv.ParseInt(s, 10, 64)
		return i, err == nil
	}
}
