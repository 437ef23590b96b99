// Package deadletter provides the outbox_dead_letter input: it reads the
// outbox rows that ended FAILED and emits each one once it is acknowledged
// (at least once), for publishing to a dead-letter topic.
package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	dlFieldBatchSize    = "batch_size"
	dlFieldPollInterval = "poll_interval"
	dlFieldLease        = "lease"
)

// writeTimeout bounds a claim, a mark or a release, which run to their end
// even when the engine's context is gone.
const writeTimeout = 10 * time.Second

var deadLetterSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Categories("Services").
		Summary("Emits the outbox rows that ended `FAILED`, each until it is acknowledged, for a dead-letter topic.").
		Description(`
Reads `+"`forward_records`"+` rows with status `+"`FAILED`"+` that have not been published yet, oldest first, up to
`+"`batch_size`"+` per batch. When the output acknowledges a batch its rows are marked published
(`+"`dead_lettered_at`"+`) and are not emitted again; a nacked batch is emitted again after `+"`poll_interval`"+`.
Delivery is at least once: a crash between the output's write and the mark publishes the row again.
A row that an operator requeues (`+"`forwarder outbox requeue`"+`) loses its mark, so if it fails again it
is published again.

Several instances may run against one database: each batch is claimed with `+"`FOR UPDATE SKIP LOCKED`"+`
and leased for `+"`lease`"+`, so instances do not emit the same rows. A row whose holder vanished is taken
again when its lease runs out. On shutdown rows claimed and not yet acknowledged are given back at once.

The message body is the stored payload, byte for byte. Metadata: `+"`outbox_id`"+`, `+"`message_key`"+`,
`+"`api_type`"+`, `+"`last_error`"+` (why the row failed), `+"`last_http_status`"+` (absent when the platform never
answered), `+"`attempt_count`"+`, `+"`kafka_topic`"+`, `+"`kafka_partition`"+`, `+"`kafka_offset`"+` and `+"`kafka_key`"+` (where the
message was consumed from), `+"`outbox_created_at_ms`"+` and `+"`failed_at_ms`"+` (Unix milliseconds).

Rows becoming `+"`FAILED`"+` are not announced, so the input finds them by polling every `+"`poll_interval`"+`;
it claims again as soon as a batch is handed on and sleeps only when none is waiting. Rows that were
already `+"`FAILED`"+` when the input first ran are published too.`).
		Fields(streamdb.DSNFields()...).
		Fields(
			service.NewIntField(dlFieldBatchSize).
				Description("Most rows claimed by one statement and emitted as one batch.").
				Default(100).
				LintRule(fieldlint.Int(checkBatchSize)),
			service.NewDurationField(dlFieldPollInterval).
				Description("How long the input sleeps when no failed row is waiting, and how long a nacked row waits before it is emitted again.").
				Default("5s").
				LintRule(fieldlint.Duration(dlFieldPollInterval, checkPollInterval)),
			service.NewDurationField(dlFieldLease).
				Description("How long a claimed row stays owned without being acknowledged. After it another instance may emit the row again, so keep it well above the time the output needs to write a batch, retries included.").
				Default("60s").
				LintRule(fieldlint.Duration(dlFieldLease, checkLease)).
				Advanced(),
		).
		Example("Dead-letter topic", "Publishes every failed message to a Kafka topic, keyed by its message key, with the reason as a header.", `
input:
  outbox_dead_letter:
    batch_size: 100
    poll_interval: 5s
pipeline:
  processors:
    - mapping: |
        meta reason = @last_error
output:
  kafka_franz:
    seed_brokers: [ "${KAFKA_BROKERS:localhost:9092}" ]
    topic: ${KAFKA_TOPIC_DEAD_LETTER:forwarder-dead-letter}
    key: ${! @message_key }
    metadata:
      include_patterns: [ "^reason$", "^api_type$" ]
`)
})

// The checks of single fields, which start-up runs on the parsed values and
// lint (fieldlint) on the values written, with the same words.
var (
	checkBatchSize    = fieldlint.Range(1, math.MaxInt, "field "+dlFieldBatchSize+": %d must be at least 1")
	checkPollInterval = fieldlint.Range(1, fieldlint.MaxDuration, "field "+dlFieldPollInterval+": %v must be positive (DEAD_LETTER_POLL_INTERVAL)")
	checkLease        = fieldlint.Range(time.Second, fieldlint.MaxDuration, "field "+dlFieldLease+": %v must be at least 1s")
)

func init() {
	service.MustRegisterBatchInput("outbox_dead_letter", deadLetterSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
			return newDeadLetterFromParsed(conf, mgr)
		})
}

// deadLetter is the outbox_dead_letter input.
type deadLetter struct {
	hub          *streamdb.DB
	batchSize    int
	pollInterval time.Duration
	lease        time.Duration

	log *service.Logger

	mu   sync.Mutex
	pool *pgxpool.Pool
	// held maps the id of every row claimed and not yet acknowledged to its
	// claim token, so that Close can give them back.
	held   map[int64]string
	closed bool
	// closing is closed by Close, waking a ReadBatch that waits.
	closing chan struct{}
	// started holds the first claim until the process has started
	// (launch.Process): a SIGTERM before then would kill the process with
	// its claims held.
	started *launch.Gate
}

func newDeadLetterFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*deadLetter, error) {
	in := &deadLetter{
		log:     mgr.Logger(),
		held:    map[int64]string{},
		closing: make(chan struct{}),
		started: launch.Process,
	}
	var err error
	in.batchSize = pluginconf.Field(&err, conf.FieldInt, dlFieldBatchSize)
	in.pollInterval = pluginconf.Field(&err, conf.FieldDuration, dlFieldPollInterval)
	in.lease = pluginconf.Field(&err, conf.FieldDuration, dlFieldLease)
	if err = cmp.Or(err, checkBatchSize(in.batchSize), checkPollInterval(in.pollInterval), checkLease(in.lease)); err != nil {
		return nil, err
	}
	// Parsed now so that a bad DSN fails at config time, without network.
	if in.hub, err = streamdb.FromParsed(conf, mgr); err != nil {
		return nil, err
	}
	return in, nil
}

// Connect opens the pool; called again after a lost connection it only
// checks the database is back.
func (in *deadLetter) Connect(ctx context.Context) error {
	return in.hub.Connect(ctx, &in.mu, &in.pool, &in.closed, nil)
}

// ReadBatch claims FAILED rows not yet published and returns them as one
// batch. With none waiting it polls every poll_interval until ctx is
// cancelled or the input closes.
func (in *deadLetter) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	in.mu.Lock()
	pool, closed := in.pool, in.closed
	in.mu.Unlock()
	if closed {
		return nil, nil, service.ErrEndOfInput
	}
	if pool == nil {
		return nil, nil, service.ErrNotConnected
	}
	if err := in.started.Wait(ctx); err != nil {
		return nil, nil, err
	}
	for {
		// The claim is not cut short by ctx: cancelled after PostgreSQL
		// committed it, its rows would stay leased, unseen, for a whole
		// lease. Rows it returns once ctx is done are given back by emit.
		claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		rows, err := outboxdb.ClaimDeadLetters(claimCtx, pool, in.batchSize, in.lease)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if checkErr := outboxdb.CheckWritable(ctx, pool); checkErr != nil {
				in.log.Warnf("Outbox database unreachable or read-only, reconnecting: %v", checkErr)
				return nil, nil, service.ErrNotConnected
			}
			return nil, nil, err
		}
		if len(rows) > 0 {
			return in.emit(ctx, pool, rows)
		}
		t := time.NewTimer(in.pollInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-in.closing:
			t.Stop()
			return nil, nil, service.ErrEndOfInput
		}
	}
}

// emit turns claimed rows into a batch. If shutdown began meanwhile the rows
// are given back unsent instead: the engine would drop the batch unread.
func (in *deadLetter) emit(ctx context.Context, pool *pgxpool.Pool, rows []outboxdb.Record) (service.MessageBatch, service.AckFunc, error) {
	refs := make([]outboxdb.DeadLetterRef, len(rows))
	batch := make(service.MessageBatch, len(rows))
	in.mu.Lock()
	for i, r := range rows {
		refs[i] = r.DeadLetterRef()
		batch[i] = newMessage(r)
		in.held[r.ID] = r.DeadLetterToken
	}
	in.mu.Unlock()
	if ctx.Err() != nil {
		in.release(ctx, pool, refs, 0, "claimed during shutdown")
		return nil, nil, ctx.Err()
	}
	// The indexer maps a partial failure reported by the output back to
	// this batch's rows, whatever the processors did to the batch.
	return batch, in.ackFunc(pool, batch.Index(), refs), nil
}

func newMessage(r outboxdb.Record) *service.Message {
	msg := service.NewMessage(r.Payload)
	// SetFailed sets the row's part of the claim (id, key, API type, Kafka
	// origin, creation time), not the claim's own.
	f := msgmeta.Failed{Claim: msgmeta.ClaimOf(r), LastError: r.LastErrorText(), AttemptCount: r.AttemptCount}
	if r.FailedAt != nil {
		f.FailedAt = *r.FailedAt
	}
	if r.LastHTTPStatus != nil {
		f.LastHTTPStatus = int(*r.LastHTTPStatus)
	}
	msgmeta.SetFailed(msg, f)
	return msg
}

// ackFunc marks the batch's rows published on an ack. On a nack the rows go
// back, to be emitted again after poll_interval; when the output reports
// which messages failed (a partial write), only those go back and the others
// are marked. If the mark itself fails the rows stay claimed and are
// published once more after the lease (at least once).
func (in *deadLetter) ackFunc(pool *pgxpool.Pool, idx *service.Indexer, refs []outboxdb.DeadLetterRef) service.AckFunc {
	return func(ctx context.Context, ackErr error) error {
		done, failed := refs, []outboxdb.DeadLetterRef(nil)
		if ackErr != nil {
			done, failed = splitByOutcome(idx, refs, ackErr)
		}
		var errs []error
		if len(done) > 0 {
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
			n, err := outboxdb.MarkDeadLettered(mctx, pool, done)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%w (they are published again after the lease)", err))
			} else if n < int64(len(done)) {
				// Requeued meanwhile, or the lease ran out and another
				// instance took them: theirs to publish now.
				in.log.Debugf("Marked %d of %d published rows; the others changed hands meanwhile", n, len(done))
			}
			in.forget(done)
		}
		if len(failed) > 0 {
			in.release(ctx, pool, failed, in.pollInterval, "nacked: "+ackErr.Error())
		}
		return errors.Join(errs...)
	}
}

// splitByOutcome separates the rows the output wrote from those it did not.
// Without per-message detail every row failed; a row is written only when
// the error says so for every message derived from it.
func splitByOutcome(idx *service.Indexer, refs []outboxdb.DeadLetterRef, ackErr error) (done, failed []outboxdb.DeadLetterRef) {
	var bErr *service.BatchError
	if !errors.As(ackErr, &bErr) || bErr.IndexedErrors() == 0 {
		return nil, refs
	}
	ok := make([]bool, len(refs))
	bad := make([]bool, len(refs))
	bErr.WalkMessagesIndexedBy(idx, func(i int, _ *service.Message, err error) bool {
		if i >= 0 && i < len(refs) {
			if err != nil {
				bad[i] = true
			} else {
				ok[i] = true
			}
		}
		return true
	})
	for i, r := range refs {
		if ok[i] && !bad[i] {
			done = append(done, r)
		} else {
			failed = append(failed, r)
		}
	}
	return done, failed
}

// release gives claims back, available again after delay. On failure they
// stay claimed until their lease runs out.
func (in *deadLetter) release(ctx context.Context, pool *pgxpool.Pool, refs []outboxdb.DeadLetterRef, delay time.Duration, why string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	n, err := outboxdb.ReleaseDeadLetters(rctx, pool, refs, delay)
	if err != nil {
		in.log.Errorf("Could not give back %d dead-letter rows (%s); they are emitted again after the lease: %v", len(refs), why, err)
		return
	}
	in.forget(refs)
	in.log.Debugf("Gave back %d of %d dead-letter rows (%s)", n, len(refs), why)
}

// Close gives back every claim not yet acknowledged and closes the pool.
func (in *deadLetter) Close(ctx context.Context) error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	close(in.closing)
	pool := in.pool
	refs := make([]outboxdb.DeadLetterRef, 0, len(in.held))
	for id, token := range in.held {
		refs = append(refs, outboxdb.DeadLetterRef{ID: id, Token: token})
	}
	in.mu.Unlock()
	if pool == nil {
		return nil
	}
	defer in.hub.Release()
	if len(refs) > 0 {
		in.release(ctx, pool, refs, 0, "not acknowledged at shutdown")
	}
	return nil
}

func (in *deadLetter) forget(refs []outboxdb.DeadLetterRef) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, r := range refs {
		if in.held[r.ID] == r.Token {
			delete(in.held, r.ID)
		}
	}
}
