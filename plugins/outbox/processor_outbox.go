// Package outbox provides the outbox processor: it persists every message of a
// batch into the PostgreSQL outbox (forward_records) before Benthos may ack
// it, which is what lets the Kafka offset move only once a message is safe.
package outbox

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/tracectx"
)

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
	// directChunkRows caps the records of one statement while a dispatcher
	// takes rows at insert, and directWait is how long such a chunk waits
	// for the dispatcher's room while delivery is moving
	// (dispatch.Ledger.ReserveWithin): a Kafka backlog is then inserted
	// claimed, at the pace it is sent, rather than PENDING and claimed again
	// (docs/architecture.md, Direct dispatch). A chunk waits for room for
	// all of its rows, so it is a fraction of max_unacked_direct.
	directChunkRows = 600
	directWait      = 50 * time.Millisecond
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
	// chunkRows caps a chunk's records when a dispatcher takes rows at
	// insert; directWait bounds its wait for room.
	chunkRows  int
	directWait time.Duration

	mMissingID    *service.MetricCounter
	mPersisted    *service.MetricCounter
	mKeyConflicts *service.MetricCounter
	// roomWaited observes each wait of a chunk for the dispatcher's room
	// (forwarder_ingest_room_wait_seconds; tests replace it).
	roomWaited func(time.Duration)
	// conflicts logs the messages skipped under another message's key, a
	// line per burst.
	conflicts *lograte.Burst

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
		chunkRows:    directChunkRows,
		directWait:   directWait,

		outageLogEvery: defaultOutageLogEvery,
		mMissingID:     mgr.Metrics().NewCounter("forwarder_missing_message_id_total"),
		mPersisted:     persistedCounter(mgr),
		mKeyConflicts:  mgr.Metrics().NewCounter("forwarder_key_conflicts_total"),
		conflicts:      lograte.New(mgr.Logger(), 10*time.Second),
		tracer:         tracectx.Tracer(mgr),
	}
	var err error
	if conf.Contains(opFieldKey) {
		p.key = pluginconf.Field(&err, conf.FieldInterpolatedString, opFieldKey)
	}
	if conf.Contains(opFieldAPIType) {
		p.apiType = pluginconf.Field(&err, conf.FieldInterpolatedString, opFieldAPIType)
	}
	if conf.Contains(opFieldAPITypes) {
		p.apiTypes = pluginconf.Field(&err, conf.FieldStringMap, opFieldAPITypes)
	}
	emit := pluginconf.Field(&err, conf.FieldString, opFieldEmit)
	p.direct = pluginconf.Field(&err, conf.FieldBool, opFieldDirectDispatch)
	ordering := pluginconf.Field(&err, conf.FieldString, opFieldOrdering)
	p.maxPayload = pluginconf.Field(&err, conf.FieldInt, opFieldMaxPayloadBytes)
	if err != nil {
		return nil, err
	}
	if len(p.apiTypes) == 0 {
		p.apiTypes = nil
	}
	for topic, t := range p.apiTypes {
		if err := checkAPIType(topic, t); err != nil {
			return nil, err
		}
	}
	switch {
	case p.apiType != nil && p.apiTypes != nil:
		return nil, fmt.Errorf("set %s or %s, not both", opFieldAPITypes, opFieldAPIType)
	case p.apiType == nil && p.apiTypes == nil:
		return nil, fmt.Errorf("set %s (topic to API type) or %s", opFieldAPITypes, opFieldAPIType)
	}
	if err := cmp.Or(checkEmit(emit), checkOrdering(ordering), checkMaxPayloadBytes(p.maxPayload)); err != nil {
		return nil, err
	}
	p.orderBerth = ordering == orderingBerth

	metricseries.Counter(p.mMissingID)
	metricseries.Counter(p.mKeyConflicts)
	roomWait := mgr.Metrics().NewTimer("forwarder_ingest_room_wait_seconds")
	metricseries.Timer(roomWait, nil)
	p.roomWaited = func(d time.Duration) { roomWait.Timing(d.Nanoseconds()) }
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
	if err := p.keyReusedCoordinatesApart(ctx, recs); err != nil {
		return nil, err
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

	// Chunks keep one statement's bytea[] far below PostgreSQL's 1 GB limit,
	// and while a dispatcher takes rows at insert they are small enough to
	// wait for its room; otherwise a batch of small messages is one chunk.
	// Each chunk commits on its own, which is safe because a retried chunk
	// finds its rows already there.
	maxRows := len(recs)
	if p.direct && p.hub.Dispatcher() != nil {
		maxRows = p.chunkRows
	}
	var counts outboxdb.InsertCounts
	for start := 0; start < len(recs); {
		end, size := start, 0
		for end < len(recs) && (end == start || size+len(recs[end].Payload) <= p.chunkBytes && end-start < maxRows) {
			size += len(recs[end].Payload)
			end++
		}
		chunk := recs[start:end]
		var (
			hand     handover
			existing int
		)
		err := p.persist(ctx, func(ctx context.Context) error {
			c, err := p.insertChunk(ctx, chunk, &hand)
			if err == nil {
				counts.Pending += c.Pending
				counts.Failed += c.Failed
				existing = c.Existing
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		if existing > 0 {
			p.checkKeyConflicts(ctx, chunk)
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

// checkKeyConflicts looks, once chunk is stored, for its records that were
// skipped as duplicates though their payload differs from the stored one's:
// a Kafka redelivery is byte for byte the same, so these are other messages
// reusing a key (docs/guarantees.md, idempotency), which the forwarder
// never sends. Each is counted and logged with its Kafka coordinates, to be
// found there; the batch is acknowledged either way.
func (p *outboxProcessor) checkKeyConflicts(ctx context.Context, chunk []outboxdb.NewRecord) {
	cctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	idx, err := outboxdb.KeyConflicts(cctx, p.pool, chunk)
	if err != nil {
		if ctx.Err() == nil {
			p.conflicts.Warn("check", "Could not check the duplicate keys of a batch for other payloads: "+err.Error())
		}
		return
	}
	if len(idx) > 0 {
		p.mKeyConflicts.Incr(int64(len(idx)))
	}
	for _, i := range idx {
		r := &chunk[i]
		p.conflicts.Warn("conflict", fmt.Sprintf("Message %s[%d]@%d not stored: its key %q is stored already with a different payload (a redelivery would be identical: does the producer reuse messageId?); the stored one: forwarder outbox show %q",
			r.KafkaTopic, r.KafkaPartition, r.KafkaOffset, r.MessageKey, r.MessageKey))
	}
}

// keyReusedCoordinatesApart gives each record keyed by its Kafka
// coordinates (it has no messageId) whose coordinates already key a row
// with another payload a key of its own, reusedCoordinatesKey, before it is
// inserted. Kafka redelivers a record byte for byte, so the stored row is an
// earlier message's at the same coordinates: the topic was deleted and
// created again (its offsets start over) or the cluster was replaced.
// Under the coordinates alone the message would be skipped as a key
// conflict and never sent. The new key is the same for every redelivery of
// the message, and a record whose new key has a row already is given it
// too (a redelivery, a replay of the topic, after retention retired the
// coordinates' first row), so redeliveries are still recognized. The
// records keep their places in the batch (and so their order per berth).
func (p *outboxProcessor) keyReusedCoordinatesApart(ctx context.Context, recs []outboxdb.NewRecord) error {
	var (
		idx        []int
		sub        []outboxdb.NewRecord
		reusedKeys []string
	)
	for i := range recs {
		if r := &recs[i]; keyedByCoordinates(r) {
			idx, sub = append(idx, i), append(sub, *r)
			reusedKeys = append(reusedKeys, reusedCoordinatesKey(r.MessageKey, r.Payload))
		}
	}
	if len(sub) == 0 {
		return nil
	}
	var reused []int
	err := p.persist(ctx, func(ctx context.Context) (err error) {
		reused, err = outboxdb.ReusedCoordinates(ctx, p.pool, sub, reusedKeys)
		return err
	})
	if err != nil {
		return err
	}
	for _, j := range reused {
		r := &recs[idx[j]]
		r.MessageKey = reusedKeys[j]
		p.conflicts.Warn("coordinates", fmt.Sprintf("Message %s[%d]@%d has no messageId and its Kafka coordinates were an earlier message's (the topic was deleted and created again, or the Kafka cluster replaced): persisting it under the key %q",
			r.KafkaTopic, r.KafkaPartition, r.KafkaOffset, r.MessageKey))
	}
	return nil
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

// insertChunk persists chunk, handing as many new rows as the stream's
// dispatcher has room for to it (see Direct dispatch), after waiting up to
// directWait for room for all of them while delivery is moving. The
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
		g = d.ReserveWithin(ctx, pendingSizes(chunk), p.directWait)
		if g.Waited > 0 {
			p.roomWaited(g.Waited)
		}
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
		err = outboxdb.WhenReadOnly(p.pool, err)
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
	p.conflicts.Flush()
	return nil
}
