package outbox

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	opFieldKey             = "key"
	opFieldAPITypes        = "api_types"
	opFieldAPIType         = "api_type"
	opFieldEmit            = "emit"
	opFieldMaxPayloadBytes = "max_payload_bytes"
	opFieldDirectDispatch  = "direct_dispatch"
	opFieldOrdering        = "ordering"

	// emitNone is the only value emit takes: the processor passes nothing
	// on. emit: new (passing new rows on, for an inline delivery path) was
	// used by no pipeline and is gone; the outbox_retry input delivers.
	emitNone = "none"

	orderingBerth = "berth"
	orderingOff   = "off"

	// apiTypeUnknown is stored for a FAILED row whose API type could not be
	// resolved; api_type is NOT NULL.
	apiTypeUnknown = "UNKNOWN"
)

var outboxProcessorSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Integration").
		Summary("Persists each message of a batch into the PostgreSQL outbox, idempotently, before the batch is acknowledged.").
		Description(backticks(`
Every message becomes one row of ^forward_records^, keyed by its idempotency key, in one
^INSERT … ON CONFLICT (message_key) DO NOTHING^ statement per batch that also notifies the
dispatchers (channel ^forwarder_outbox^) when a new PENDING row was committed. A message
whose key already has a row, in any status, changes nothing, so Kafka redeliveries are harmless. Duplicate
keys inside one batch are collapsed (the first message wins).

### Acknowledgement

The processor returns no messages once the rows are committed, so Benthos acknowledges the batch at
once and the input commits its offsets: an offset never moves before its message is stored. The rows
are delivered by an ^outbox_retry^ input (of this process, through direct dispatch, or of any
instance on the same database).

When PostgreSQL is unreachable the processor holds the batch and retries with a capped exponential backoff
until the rows are committed or the stream stops; a stopping stream gets the context error, so the batch is
nacked and redelivered later. It never flags a batch as failed instead, because Benthos would pass a flagged
batch on and acknowledge it. One error is logged when an outage starts and one line when it ends.

### What is stored

The payload is stored as received, byte for byte, in a ^bytea^ column (bytes that are not UTF-8
included), together with the Kafka topic, partition, offset and key (^kafka_key^, also
^bytea^; NULL when the metadata is absent). A message that cannot be forwarded is still stored, with
status FAILED and ^last_error^ saying why, and is never sent or retried: an empty payload (or a
tombstone), one larger than ^max_payload_bytes^, one that is not valid UTF-8, not valid JSON or not a
JSON object, or one whose API type cannot be resolved (stored with api_type ^UNKNOWN^). A message
that ^kafka_franz^ marked ^kafka_oversize^ stands for a record it would not read whole (larger than its
^max_message_bytes^, or in a compressed batch that decompresses past its bound): it is stored FAILED under
the fallback key with no payload, and ^last_error^ says ^payload not stored: ^ and the input's reason,
which names the size.

### Keys

By default the key is the payload's top-level ^messageId^ (a string, or a number's text). When it is
missing, null or empty, or the payload is not a JSON object, the key is
^<kafka_topic>-<kafka_partition>-<kafka_offset>^, stable across redeliveries of the same record; a
missing id is logged as a warning and counted in ^forwarder_missing_message_id_total^. When those
coordinates already key a row with another payload, the stored row is an earlier message's (the topic
was deleted and created again and its offsets started over, or the Kafka cluster was replaced): the
message is stored under ^<kafka_topic>-<kafka_partition>-<kafka_offset>~^ and the first 16 hex digits
of its payload's SHA-256, the same for each redelivery (a redelivery finds it even once retention has
retired the earlier row), and a warning says so. A key that
PostgreSQL cannot index (over 1024 bytes, NUL characters) fails the message with the fallback key.
A message whose key is stored already is not stored again; when its payload differs from the stored
one it is not a redelivery but another message reusing the key, and it is counted in
^forwarder_key_conflicts_total^ and logged with its Kafka coordinates.

### Direct dispatch

When the same process runs an ^outbox_retry^ input on the same ^dsn^ (as ^pipelines/forwarder.yaml^
does) and it holds fewer rows than its ^max_unacked_direct^, the processor inserts new rows already
claimed for it (^IN_PROGRESS^, attempt 1, a claim token and a lease, exactly what a claim would
have made of them) and hands them over in memory, in the same statement that persists them. A new row then costs one
statement fewer and reaches the output without the notify-and-claim round trip. While rows are being
delivered (some left the dispatcher within the last second) and no other instance has said it is idle,
the processor inserts at most 600 records a statement and waits up to 50 ms for room for all of
them, so that a Kafka backlog is read at the pace it is delivered and each row is written claimed
once. What the dispatcher has no room for then is inserted ^PENDING^ and claimed from the database
as usual: with the platform hanging or down no row leaves the dispatcher, and a second after the
last one left ingestion no longer waits at all. A crash before a result is written is recovered by the lease like any other claim.
^direct_dispatch: false^ turns it off.

### Ordering

With ^ordering: berth^ (the default) a vehicle event whose payload has both a top-level ^parkCode^ and
a top-level ^berthCode^ (strings) is stored with the ordering key ^<parkCode>/<berthCode>^: it is
not sent while an earlier row of its berth (persisted before it: for one Kafka partition, in offset
order) is unfinished, and the berths' events reach the platform in that order, one at a time per berth,
while other berths flow freely. Heartbeats, messages stored FAILED and events without both codes are not
ordered. ^ordering: off^ stores no key. The ^outbox_retry^ input's ^order_on_failed^ says what a FAILED
row does to the rows of its berth after it. Rows of one key within a batch keep batch order. A row that
has to wait is not handed over by direct dispatch.

### Metrics

^forwarder_rows_persisted_total{status}^ counts new rows by status (PENDING, FAILED; rows handed
over directly count as PENDING);
^forwarder_missing_message_id_total^ counts messages stored under the fallback key;
^forwarder_key_conflicts_total^ counts messages not stored because their key was stored already with a
different payload (a redelivery is the same bytes: this is another message reusing the key), each
also logged as a warning with its Kafka coordinates;
^forwarder_ingest_errors_total^ counts failed attempts to persist a batch (the batch is held and
retried, and a failure that lasts is logged again at ERROR every minute);
^forwarder_ingest_room_wait_seconds^ (a histogram) observes each wait of a chunk for the
dispatcher's room (see Direct dispatch): while its ^_sum^ rises the ingest runs at the pace of
delivery, and a backlog waits in Kafka (consumer lag) rather than as PENDING rows.`)).
		Fields(streamdb.DSNFields()...).
		Fields(
			service.NewInterpolatedStringField(opFieldKey).
				Description("The idempotency key of a message. When unset, the payload's top-level `messageId` (parsed without decoding the whole payload). When the value is missing or empty, the key falls back to `<kafka_topic>-<kafka_partition>-<kafka_offset>` with a warning.").
				Example(`${! json("header.id") }`).
				Optional(),
			service.NewStringMapField(opFieldAPITypes).
				Description("The API type of the messages of each Kafka topic (metadata `kafka_topic`): `VEHICLE_EVENT` or `HEARTBEAT`. A message from a topic not listed is stored FAILED with api_type `UNKNOWN`. Set this or `api_type`.").
				Example(map[string]any{"device-vehicle-event": outboxdb.APITypeVehicleEvent, "device-heartbeat": outboxdb.APITypeHeartbeat}).
				Optional().
				LintRule(fieldlint.Rule(lintAPITypes)),
			service.NewInterpolatedStringField(opFieldAPIType).
				Description("The API type as an interpolation, instead of `api_types`. A value other than `VEHICLE_EVENT` or `HEARTBEAT` stores the message FAILED with api_type `UNKNOWN`.").
				Example(`${! if meta("kafka_topic").has_suffix("heartbeat") { "HEARTBEAT" } else { "VEHICLE_EVENT" } }`).
				Optional(),
			service.NewStringAnnotatedEnumField(opFieldEmit, map[string]string{
				emitNone: "Persist only: no message is passed on, so the batch is acknowledged (and its offsets committed) as soon as its rows are committed.",
			}).
				Description("What the processor returns after persisting: nothing. Kept so that configs that spell out `emit: none` stay valid; `new` (passing new rows on) was removed, and the `outbox_retry` input delivers them.").
				Default(emitNone).
				LintRule(fieldlint.Exact([]string{emitNone}, checkEmit)).
				Advanced(),
			service.NewBoolField(opFieldDirectDispatch).
				Description("Hand new rows, inserted already claimed, to an `outbox_retry` input of the same process and `dsn` when it has room (see Direct dispatch).").
				Default(true).
				Advanced(),
			service.NewStringAnnotatedEnumField(opFieldOrdering, map[string]string{
				orderingBerth: "Vehicle events are delivered in order per berth (`parkCode` + `berthCode`); see Ordering.",
				orderingOff:   "No ordering: every row is sent as soon as it is due.",
			}).
				Description("Which rows are delivered in order, one at a time per key (`ORDERING`).").
				Default(orderingBerth).
				Example("${ORDERING:berth}").
				LintRule(fieldlint.Exact([]string{orderingBerth, orderingOff}, checkOrdering)),
			service.NewIntField(opFieldMaxPayloadBytes).
				Description("Payloads larger than this are stored FAILED instead of being parsed.").
				Default(1<<20).
				LintRule(fieldlint.Int(checkMaxPayloadBytes)),
		).
		LintRule(`let types = this.api_types.or({}).length() > 0
let expr = this.api_type.or("") != ""
root = match {
  $types && $expr => [ "set api_types or api_type, not both" ],
  !$types && !$expr => [ "set api_types (topic to API type) or api_type" ],
}`).
		Example("Persist-only ingest",
			"Stores every Kafka message before its offset is committed; the outbox_retry input delivers them.",
			`
input:
  kafka_franz:
    seed_brokers: [ "${KAFKA_BROKERS:localhost:9092}" ]
    topics: [ device-vehicle-event, device-heartbeat ]
    consumer_group: forwarder
pipeline:
  processors:
    - outbox:
        dsn: "${DATABASE_URL:postgres://localhost:5432/forwarder}"
        api_types:
          device-vehicle-event: VEHICLE_EVENT
          device-heartbeat: HEARTBEAT
        emit: none
        max_payload_bytes: 1048576
output:
  drop: {}
`)
})

// lintAPITypes checks the api_types map as the constructor does. Benthos
// runs a map field's rule on the map and on each value: only the map is
// checked, so that the topic can be named.
func lintAPITypes(v any) []string {
	m, _ := v.(map[string]any)
	var lints []string
	for _, topic := range slices.Sorted(maps.Keys(m)) {
		if t, ok := m[topic].(string); ok {
			if err := checkAPIType(topic, t); err != nil {
				lints = append(lints, err.Error())
			}
		}
	}
	return lints
}

// checkAPIType refuses an api_types entry that maps topic to no API type
// the forwarder knows, for start-up and for lint.
func checkAPIType(topic, t string) error {
	if validAPIType(t) {
		return nil
	}
	return fmt.Errorf("field %s: topic %q maps to %q, want %s or %s", opFieldAPITypes, topic, t, outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat)
}

// backticks lets a raw string hold Markdown code spans, written as ^code^.
func backticks(s string) string { return strings.ReplaceAll(s, "^", "`") }

func init() {
	service.MustRegisterBatchProcessor("outbox", outboxProcessorSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchProcessor, error) {
			return newOutboxProcessorFromParsed(conf, mgr)
		})
}

// checkMaxPayloadBytes, checkEmit and checkOrdering are the checks of their
// fields, which start-up runs on the parsed values and lint (fieldlint) on
// the values written, with the same words.
var checkMaxPayloadBytes = fieldlint.Range(1, math.MaxInt, "field "+opFieldMaxPayloadBytes+": must be at least 1, got %d")

func checkEmit(s string) error {
	if s != emitNone {
		return fmt.Errorf("field %s: %q is not supported: the processor passes nothing on (%s) and an outbox_retry input delivers the rows; remove the field or set it to %s", opFieldEmit, s, emitNone, emitNone)
	}
	return nil
}

func checkOrdering(s string) error {
	if s != orderingBerth && s != orderingOff {
		return fmt.Errorf("field %s (ORDERING in the shipped pipeline): %q is not %s or %s", opFieldOrdering, s, orderingBerth, orderingOff)
	}
	return nil
}
