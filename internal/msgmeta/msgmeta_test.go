package msgmeta_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestClaimOf: a claimed row's claim, each field from its column, and no
// previous failure for a row that carries none.
func TestClaimOf(t *testing.T) {
	created := time.UnixMilli(1779330600123)
	lease, failed := created.Add(time.Minute), created.Add(time.Second)
	r := outboxdb.Record{ID: 42, MessageKey: "8f14e45f", APIType: "VEHICLE_EVENT", AttemptCount: 3, ClaimToken: "tok",
		KafkaTopic: "device-vehicle-event", KafkaPartition: 2, KafkaOffset: 99, KafkaKey: []byte("CAM-1"),
		CreatedAt: created, NextRetryAt: &lease, PreviousFailureAt: &failed}
	got := msgmeta.ClaimOf(r)
	if got.ID != 42 || got.MessageKey != "8f14e45f" || got.APIType != "VEHICLE_EVENT" || got.Attempt != 3 || got.Token != "tok" ||
		got.Kafka.Topic != "device-vehicle-event" || got.Kafka.Partition != 2 || got.Kafka.Offset != 99 || string(got.Kafka.Key) != "CAM-1" ||
		!got.CreatedAt.Equal(created) || !got.LeaseExpiresAt.Equal(lease) || !got.PreviousFailure.Equal(failed) {
		t.Fatalf("claim of %+v: %+v", r, got)
	}
	r.PreviousFailureAt = nil
	if got := msgmeta.ClaimOf(r); !got.PreviousFailure.IsZero() {
		t.Fatalf("a row without a previous failure gives %v", got.PreviousFailure)
	}
}

func TestClaimRoundTrip(t *testing.T) {
	created := time.UnixMilli(1779330600123)
	lease := created.Add(time.Minute)
	want := msgmeta.Claim{
		ID: 42, MessageKey: "8f14e45f", APIType: "VEHICLE_EVENT", Attempt: 3, Token: "tok",
		Kafka:     msgmeta.Kafka{Topic: "device-vehicle-event", Partition: 2, Offset: 99, Key: []byte("CAM-1")},
		CreatedAt: created, LeaseExpiresAt: lease, PreviousFailure: created.Add(1500 * time.Microsecond),
	}
	msg := service.NewMessage(nil)
	msgmeta.SetClaim(msg, want)
	got, err := msgmeta.ReadClaim(msg)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != want.ID || got.MessageKey != want.MessageKey || got.APIType != want.APIType ||
		got.Attempt != want.Attempt || got.Token != want.Token || !got.CreatedAt.Equal(created) ||
		!got.LeaseExpiresAt.Equal(lease) || !got.PreviousFailure.Equal(created.Add(2*time.Millisecond)) || got.Kafka.Topic != want.Kafka.Topic ||
		got.Kafka.Partition != 2 || got.Kafka.Offset != 99 || string(got.Kafka.Key) != "CAM-1" {
		t.Fatalf("read back %+v, want %+v", got, want)
	}
}

func TestClaimWithoutPreviousFailure(t *testing.T) {
	msg := service.NewMessage(nil)
	msgmeta.SetClaim(msg, msgmeta.Claim{ID: 1, Token: "t", Attempt: 1})
	if v, ok := msg.MetaGet(msgmeta.PreviousFailureAtMs); ok {
		t.Fatalf("a row that has not failed carries %s=%q", msgmeta.PreviousFailureAtMs, v)
	}
	got, err := msgmeta.ReadClaim(msg)
	if err != nil || !got.PreviousFailure.IsZero() {
		t.Fatalf("read back %v (err %v), want no previous failure", got.PreviousFailure, err)
	}
}

// TestKeepClaim: every key SetClaim sets comes back, with its value, on a
// message a mapping stripped; a key the mapping changed, or a key outside
// the claim, is the mapping's; a message without a claim is left alone.
func TestKeepClaim(t *testing.T) {
	created := time.UnixMilli(1779330600123)
	orig := service.NewMessage(nil)
	msgmeta.SetClaim(orig, msgmeta.Claim{
		ID: 42, MessageKey: "8f14e45f", APIType: "VEHICLE_EVENT", Attempt: 3, Token: "tok",
		Kafka:     msgmeta.Kafka{Topic: "device-vehicle-event", Partition: 2, Offset: 99, Key: []byte("CAM-1")},
		CreatedAt: created, LeaseExpiresAt: created.Add(time.Minute), PreviousFailure: created,
	})
	set := map[string]any{}
	_ = orig.MetaWalkMut(func(k string, v any) error { set[k] = v; return nil })
	orig.MetaSetMut("x_custom", "1")

	stripped := service.NewMessage(nil)
	stripped.MetaSetMut(msgmeta.APIType, "HEARTBEAT")
	msgmeta.KeepClaim(orig, stripped)
	got := map[string]any{}
	_ = stripped.MetaWalkMut(func(k string, v any) error { got[k] = v; return nil })
	set[msgmeta.APIType] = "HEARTBEAT"
	if len(got) != len(set) {
		t.Errorf("kept %v, want exactly %v", got, set)
	}
	for k, want := range set {
		if got[k] != want {
			t.Errorf("metadata %s = %v, want %v", k, got[k], want)
		}
	}

	deadLettered := service.NewMessage(nil)
	msgmeta.SetFailed(deadLettered, msgmeta.Failed{Claim: msgmeta.Claim{ID: 42, MessageKey: "k"}, LastError: "x"})
	empty := service.NewMessage(nil)
	msgmeta.KeepClaim(deadLettered, empty)
	_ = empty.MetaWalkMut(func(k string, _ any) error {
		t.Errorf("a message without a claim gave %s", k)
		return nil
	})
}

func TestReadClaimNamesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		name string
		meta map[string]string
		want string
	}{
		{"NoID", map[string]string{"claim_token": "t", "attempt": "1"}, "metadata outbox_id is missing"},
		{"IDNotANumber", map[string]string{"outbox_id": "x", "claim_token": "t", "attempt": "1"}, `metadata outbox_id: "x" is not an integer`},
		{"NoToken", map[string]string{"outbox_id": "1", "attempt": "1"}, "metadata claim_token is missing"},
		{"ZeroAttempt", map[string]string{"outbox_id": "1", "claim_token": "t", "attempt": "0"}, "metadata attempt: 0 is not a 1-based attempt number"},
		{"BadLease", map[string]string{"outbox_id": "1", "claim_token": "t", "attempt": "1", "lease_expires_at_ms": "soon"}, `metadata lease_expires_at_ms: "soon" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := service.NewMessage(nil)
			for k, v := range tc.meta {
				msg.MetaSet(k, v)
			}
			if _, err := msgmeta.ReadClaim(msg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestReadKafka(t *testing.T) {
	t.Run("IntegersOrText", func(t *testing.T) {
		msg := service.NewMessage(nil)
		msg.MetaSet(msgmeta.KafkaTopic, "t")
		msg.MetaSet(msgmeta.KafkaPartition, "7")
		msg.MetaSetMut(msgmeta.KafkaOffset, int64(12))
		k, ok := msgmeta.ReadKafka(msg)
		if !ok || k.Topic != "t" || k.Partition != 7 || k.Offset != 12 || k.Key != nil {
			t.Fatalf("%+v %v", k, ok)
		}
	})
	t.Run("MissingCoordinates", func(t *testing.T) {
		msg := service.NewMessage(nil)
		msg.MetaSet(msgmeta.KafkaTopic, "t")
		msg.MetaSetMut(msgmeta.KafkaPartition, int64(1)<<40)
		k, ok := msgmeta.ReadKafka(msg)
		if ok || k.Partition != -1 || k.Offset != -1 {
			t.Fatalf("%+v %v, want not ok with -1 coordinates", k, ok)
		}
	})
	t.Run("SetKafkaRoundTrip", func(t *testing.T) {
		msg := service.NewMessage(nil)
		msgmeta.SetKafka(msg, msgmeta.Kafka{Topic: "t", Partition: 1, Offset: 2, Key: []byte{0xff, 0}, TimestampMs: 5})
		k, ok := msgmeta.ReadKafka(msg)
		if !ok || string(k.Key) != "\xff\x00" || k.TimestampMs != 5 {
			t.Fatalf("%+v %v", k, ok)
		}
	})
}
