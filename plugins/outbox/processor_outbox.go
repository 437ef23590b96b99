// Package outbox provides the outbox processor: it persists every message of a
// batch into the PostgreSQL outbox (forward_records) before Benthos may ack
// it, which is what lets the Kafka offset move only once a message is safe.
package outbox

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/internal/tracectx"
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

func outboxProcessorSpec() *service.ConfigSpec {
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
missing id is logged as a warning and counted in ^forwarder_missing_message_id_total^. A key that
PostgreSQL cannot index (over 1024 bytes, NUL characters) fails the message with the fallback key.

### Direct dispatch

When the same process runs an ^outbox_retry^ input on the same ^dsn^ (as ^pipelines/forwarder.yaml^
does) and it has room under its ^max_unacked^, the processor inserts new rows already claimed for it
(^IN_PROGRESS^, attempt 1, a claim token and a lease, exactly what a claim would have made of them)
and hands them over in memory, in the same statement that persists them. A new row then costs one
statement fewer and reaches the output without the notify-and-claim round trip. What the dispatcher
has no room for is inserted ^PENDING^ and claimed from the database as usual, so ingestion never
waits for the dispatcher, and a crash before a result is written is recovered by the lease like any
other claim. ^direct_dispatch: false^ turns it off.

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
^forwarder_ingest_errors_total^ counts failed attempts to persist a batch (the batch is held and
retried, and a failure that lasts is logged again at ERROR every minute).`)).
		Fields(streamdb.DSNFields()...).
		Fields(
			service.NewInterpolatedStringField(opFieldKey).
				Description("The idempotency key of a message. When unset, the payload's top-level `messageId` (parsed without decoding the whole payload). When the value is missing or empty, the key falls back to `<kafka_topic>-<kafka_partition>-<kafka_offset>` with a warning.").
				Example(`${! json("header.id") }`).
				Optional(),
			service.NewStringMapField(opFieldAPITypes).
				Description("The API type of the messages of each Kafka topic (metadata `kafka_topic`): `VEHICLE_EVENT` or `HEARTBEAT`. A message from a topic not listed is stored FAILED with api_type `UNKNOWN`. Set this or `api_type`.").
				Example(map[string]any{"device-vehicle-event": outboxdb.APITypeVehicleEvent, "device-heartbeat": outboxdb.APITypeHeartbeat}).
				Optional(),
			service.NewInterpolatedStringField(opFieldAPIType).
				Description("The API type as an interpolation, instead of `api_types`. A value other than `VEHICLE_EVENT` or `HEARTBEAT` stores the message FAILED with api_type `UNKNOWN`.").
				Example(`${! if meta("kafka_topic").has_suffix("heartbeat") { "HEARTBEAT" } else { "VEHICLE_EVENT" } }`).
				Optional(),
			service.NewStringAnnotatedEnumField(opFieldEmit, map[string]string{
				emitNone: "Persist only: no message is passed on, so the batch is acknowledged (and its offsets committed) as soon as its rows are committed.",
			}).
				Description("What the processor returns after persisting: nothing. Kept so that configs that spell out `emit: none` stay valid; `new` (passing new rows on) was removed, and the `outbox_retry` input delivers them.").
				Default(emitNone).
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
				Example("${ORDERING:berth}"),
			service.NewIntField(opFieldMaxPayloadBytes).
				Description("Payloads larger than this are stored FAILED instead of being parsed.").
				Default(1<<20).
				LintRule(`root = if this < 1 { [ "max_payload_bytes must be at least 1" ] }`),
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
}

// backticks lets a raw string hold Markdown code spans, written as ^code^.
func backticks(s string) string { return strings.ReplaceAll(s, "^", "`") }

func init() {
	service.MustRegisterBatchProcessor("outbox", outboxProcessorSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchProcessor, error) {
			return newOutboxProcessorFromParsed(conf, mgr)
		})
}

// Retry timing while the database is unavailable.
const (
	retryInitial   = 100 * time.Millisecond
	retryMax       = 3 * time.Second
	attemptTimeout = time.Minute
	// defaultOutageLogEvery is how often a lasting failure to persist is
	// logged again at ERROR.
	defaultOutageLogEvery = time.Minute
	// defaultChunkBytes caps the payload bytes of one statement: a bytea[]
	// parameter cannot exceed 1 GB, and a batch of large messages would then
	// fail forever.
	defaultChunkBytes = 64 << 20
)

type outboxProcessor struct {
	log      *service.Logger
	pool     *pgxpool.Pool
	database string // host:port/db, for logs

	key        *service.InterpolatedString // nil: messageId
	apiTypes   map[string]string
	apiType    *service.InterpolatedString // nil: apiTypes
	maxPayload int
	// orderBerth gives vehicle events their berth as ordering key.
	orderBerth bool
	// hub finds the stream's dispatcher for direct dispatch.
	hub       *dispatch.Hub
	direct    bool
	closeOnce sync.Once
	// tracer starts each message's outbox.insert span; nil when the stream
	// does not trace (its rows then store no trace context).
	tracer trace.Tracer

	retryInitial, retryMax time.Duration
	chunkBytes             int

	mMissingID *service.MetricCounter
	mPersisted *service.MetricCounter

	outageMu     sync.Mutex
	outageSince  time.Time // zero while the database is reachable
	outageTries  int
	outageLogged time.Time // when the outage was last logged at ERROR
	// outageLogEvery is how often a lasting outage is logged at ERROR.
	outageLogEvery time.Duration
	mIngestFails   *service.MetricCounter

	// afterInsertClaim, when set by a test, runs after a successful
	// InsertBatchClaim; an error it returns stands for a reply lost after
	// the commit.
	afterInsertClaim func() error
}

func newOutboxProcessorFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*outboxProcessor, error) {
	p := &outboxProcessor{
		log:          mgr.Logger(),
		retryInitial: retryInitial,
		retryMax:     retryMax,
		chunkBytes:   defaultChunkBytes,

		outageLogEvery: defaultOutageLogEvery,
		mMissingID:     mgr.Metrics().NewCounter("forwarder_missing_message_id_total"),
		mPersisted:     persistedCounter(mgr),
		tracer:         tracectx.Tracer(mgr),
	}
	var err error
	if conf.Contains(opFieldKey) {
		if p.key, err = conf.FieldInterpolatedString(opFieldKey); err != nil {
			return nil, err
		}
	}
	if conf.Contains(opFieldAPIType) {
		if p.apiType, err = conf.FieldInterpolatedString(opFieldAPIType); err != nil {
			return nil, err
		}
	}
	if conf.Contains(opFieldAPITypes) {
		if p.apiTypes, err = conf.FieldStringMap(opFieldAPITypes); err != nil {
			return nil, err
		}
		if len(p.apiTypes) == 0 {
			p.apiTypes = nil
		}
		for topic, t := range p.apiTypes {
			if !validAPIType(t) {
				return nil, fmt.Errorf("field %s: topic %q maps to %q, want %s or %s", opFieldAPITypes, topic, t, outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat)
			}
		}
	}
	switch {
	case p.apiType != nil && p.apiTypes != nil:
		return nil, fmt.Errorf("set %s or %s, not both", opFieldAPITypes, opFieldAPIType)
	case p.apiType == nil && p.apiTypes == nil:
		return nil, fmt.Errorf("set %s (topic to API type) or %s", opFieldAPITypes, opFieldAPIType)
	}
	emit, err := conf.FieldString(opFieldEmit)
	if err != nil {
		return nil, err
	}
	if emit != emitNone {
		return nil, fmt.Errorf("field %s: %q is not supported: the processor passes nothing on (%s) and an outbox_retry input delivers the rows; remove the field or set it to %s", opFieldEmit, emit, emitNone, emitNone)
	}
	if p.direct, err = conf.FieldBool(opFieldDirectDispatch); err != nil {
		return nil, err
	}
	ordering, err := conf.FieldString(opFieldOrdering)
	if err != nil {
		return nil, err
	}
	switch ordering {
	case orderingBerth, orderingOff:
		p.orderBerth = ordering == orderingBerth
	default:
		return nil, fmt.Errorf("field %s (ORDERING in the shipped pipeline): %q is not %s or %s", opFieldOrdering, ordering, orderingBerth, orderingOff)
	}
	if p.maxPayload, err = conf.FieldInt(opFieldMaxPayloadBytes); err != nil {
		return nil, err
	}
	if p.maxPayload < 1 {
		return nil, fmt.Errorf("field %s: must be at least 1, got %d", opFieldMaxPayloadBytes, p.maxPayload)
	}

	metricseries.Counter(p.mMissingID)
	p.mIngestFails = mgr.Metrics().NewCounter("forwarder_ingest_errors_total")
	metricseries.Counter(p.mIngestFails)
	if p.hub, err = dispatch.HubFromParsed(conf, mgr); err != nil {
		return nil, err
	}
	p.database = p.hub.Database
	// The stream's pool dials on first use, so this does not touch the
	// network; a dead connection is replaced on a later attempt.
	if p.pool, err = p.hub.Retain(); err != nil {
		return nil, err
	}
	return p, nil
}

// persistedCounter counts new rows by status, served at 0 for both from the
// start.
func persistedCounter(mgr *service.Resources) *service.MetricCounter {
	c := mgr.Metrics().NewCounter("forwarder_rows_persisted_total", "status")
	metricseries.Counter(c, metricseries.Product([]string{string(outboxdb.StatusPending), string(outboxdb.StatusFailed)})...)
	return c
}

func validAPIType(t string) bool {
	return t == outboxdb.APITypeVehicleEvent || t == outboxdb.APITypeHeartbeat
}

// ProcessBatch persists the batch and returns only once every message has a
// committed row, or with the context's error when the stream stops first.
func (p *outboxProcessor) ProcessBatch(ctx context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	var keyExec, typeExec *service.MessageBatchInterpolationExecutor
	if p.key != nil {
		keyExec = batch.InterpolationExecutor(p.key)
	}
	if p.apiType != nil {
		typeExec = batch.InterpolationExecutor(p.apiType)
	}
	recs := make([]outboxdb.NewRecord, len(batch))
	for i, msg := range batch {
		recs[i] = p.record(i, msg, keyExec, typeExec)
	}
	if p.tracer == nil {
		return p.persistAll(ctx, recs)
	}
	end := traceInserts(p.tracer, batch, recs)
	out, err := p.persistAll(ctx, recs)
	end(err)
	return out, err
}

// persistAll persists recs, chunk by chunk.
func (p *outboxProcessor) persistAll(ctx context.Context, recs []outboxdb.NewRecord) ([]service.MessageBatch, error) {

	// Chunks keep one statement's bytea[] far below PostgreSQL's 1 GB limit; a
	// batch of small messages is one chunk. Each chunk commits on its own,
	// which is safe because a retried chunk finds its rows already there.
	var counts outboxdb.InsertCounts
	for start := 0; start < len(recs); {
		end, size := start, 0
		for end < len(recs) && (end == start || size+len(recs[end].Payload) <= p.chunkBytes) {
			size += len(recs[end].Payload)
			end++
		}
		chunk := recs[start:end]
		var hand handover
		err := p.persist(ctx, func(ctx context.Context) error {
			c, err := p.insertChunk(ctx, chunk, &hand)
			if err == nil {
				counts.Pending += c.Pending
				counts.Failed += c.Failed
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		start = end
	}
	if counts.Pending > 0 {
		p.mPersisted.Incr(int64(counts.Pending), string(outboxdb.StatusPending))
	}
	if counts.Failed > 0 {
		p.mPersisted.Incr(int64(counts.Failed), string(outboxdb.StatusFailed))
	}
	// Nothing is passed on: Benthos acknowledges the batch now that every
	// row is committed.
	return nil, nil
}

// handover is what a chunk's attempts at direct dispatch share: the claim
// tokens drawn for its records, and whether an attempt that used them
// failed. Its outcome is then unknown (the reply may have been lost after
// the commit), so the next attempt asks for the rows claimed under those
// tokens too: they are handed over as if the reply had arrived, instead of
// waiting out their lease and leaving an attempt that was never made in the
// log.
type handover struct {
	tokens []string
	tried  bool
}

// insertChunk persists chunk, handing as many new rows as the
// stream's dispatcher has room for to it (see Direct dispatch). The
// reservation is given back when the insert fails, so that a chunk that
// keeps failing does not starve the dispatcher; rows recovered by a retry
// are handed over even beyond the room the retry reserved (at most a
// chunk's worth, once).
func (p *outboxProcessor) insertChunk(ctx context.Context, chunk []outboxdb.NewRecord, h *handover) (outboxdb.InsertCounts, error) {
	var d *dispatch.Dispatcher
	if p.direct {
		d = p.hub.Dispatcher()
	}
	var g dispatch.Grant
	if d != nil {
		g = d.Reserve(pendingSizes(chunk))
	}
	if g.Rows == 0 && !h.tried {
		return outboxdb.InsertBatchCount(ctx, p.pool, chunk)
	}
	if n := g.Rows - len(h.tokens); n > 0 {
		h.tokens = append(h.tokens, outboxdb.NewClaimTokens(n)...)
	}
	claim := outboxdb.DirectClaim{}
	if d != nil {
		claim = d.DirectClaim()
	}
	claim.Limit, claim.Tokens, claim.Retry = g.Rows, h.tokens, h.tried
	c, rows, err := outboxdb.InsertBatchClaim(ctx, p.pool, chunk, claim)
	if err == nil && p.afterInsertClaim != nil {
		err = p.afterInsertClaim()
	}
	if err != nil {
		if d != nil {
			d.Deliver(g, nil)
		}
		h.tried = len(h.tokens) > 0
		return c, err
	}
	c.Pending += len(rows)
	if (d == nil || !d.Deliver(g, rows)) && len(rows) > 0 {
		p.giveBack(ctx, rows)
	}
	return c, nil
}

// giveBack releases rows claimed for a dispatcher that closed (or is gone)
// before they could be handed over, as if never claimed; failing that, their
// lease brings them back.
func (p *outboxProcessor) giveBack(ctx context.Context, rows []outboxdb.Record) {
	refs := make([]outboxdb.ClaimRef, len(rows))
	for i, r := range rows {
		refs[i] = r.Ref()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
	defer cancel()
	if _, err := outboxdb.ReleaseUnsent(rctx, p.pool, refs); err != nil {
		p.log.Warnf("Could not give back %d rows claimed for a dispatcher that stopped (they come back when their lease expires): %v", len(rows), err)
	}
}

// pendingSizes lists the payload sizes of the PENDING records, in order:
// the rows direct dispatch may claim.
func pendingSizes(recs []outboxdb.NewRecord) []int {
	sizes := make([]int, 0, len(recs))
	for i := range recs {
		if recs[i].Status == outboxdb.StatusPending {
			sizes = append(sizes, len(recs[i].Payload))
		}
	}
	return sizes
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

// persist runs insert, retrying with backoff while the database is
// unavailable. It returns an error only when ctx ends first. insert must be
// idempotent and leave its results only when it succeeds.
func (p *outboxProcessor) persist(ctx context.Context, insert func(context.Context) error) error {
	delay := p.retryInitial
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		// The schema is created or upgraded on start: the first batch
		// migrates (once per process), and an outage retries that too.
		err := p.hub.EnsureSchema(actx, p.pool)
		if err == nil {
			err = insert(actx)
		}
		cancel()
		if err == nil {
			p.recovered()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.failed(err)
		// ±20 % jitter keeps several instances from retrying in step.
		t := time.NewTimer(delay + time.Duration((rand.Float64()*0.4-0.2)*float64(delay)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		delay = min(2*delay, p.retryMax)
	}
}

// failed logs the first failure of an outage; the rest go to debug.
//
// A failure that lasts (lost permissions, a constraint, a full disk: it will
// not go away by itself) keeps the batch held, since offsets must not move,
// so it must not go unnoticed: it is logged again at ERROR every
// outageLogEvery (a minute), and every failed attempt counts in
// forwarder_ingest_errors_total (alert ForwarderIngestFailing).
func (p *outboxProcessor) failed(err error) {
	p.mIngestFails.Incr(1)
	p.outageMu.Lock()
	defer p.outageMu.Unlock()
	p.outageTries++
	now := time.Now()
	switch {
	case p.outageSince.IsZero():
		p.outageSince, p.outageLogged = now, now
		p.log.Errorf("Cannot persist to database %s, holding the batch and retrying until it is back (offsets are not committed meanwhile): %v", p.database, err)
	case now.Sub(p.outageLogged) >= p.outageLogEvery:
		p.outageLogged = now
		p.log.Errorf("Still cannot persist to database %s after %s and %d attempts (offsets are not committed meanwhile): %v",
			p.database, now.Sub(p.outageSince).Round(time.Second), p.outageTries, err)
	default:
		p.log.Debugf("Still cannot persist to database %s (attempt %d): %v", p.database, p.outageTries, err)
	}
}

// recovered logs the end of an outage.
func (p *outboxProcessor) recovered() {
	p.outageMu.Lock()
	defer p.outageMu.Unlock()
	if p.outageSince.IsZero() {
		return
	}
	p.log.Infof("Database %s is back after %s and %d failed attempts; persisting again", p.database, time.Since(p.outageSince).Round(time.Millisecond), p.outageTries)
	p.outageSince, p.outageTries = time.Time{}, 0
}

// Close releases the pool's connections.
func (p *outboxProcessor) Close(context.Context) error {
	p.closeOnce.Do(p.hub.Release)
	return nil
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

func coordinates(topic string, partition int32, offset int64) string {
	return topic + "-" + strconv.FormatInt(int64(partition), 10) + "-" + strconv.FormatInt(offset, 10)
}
