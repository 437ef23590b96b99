package outboxdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultAdminBatchSize is how many rows requeue and purge change per
// transaction: small enough that locks are held briefly while the service
// runs, large enough that a million rows take a few hundred statements.
const DefaultAdminBatchSize = 5000

// ValueCount is one line of a top-N list.
type ValueCount struct {
	// Value is the counted value ("" when the rows have none).
	Value string
	// Rows is how many rows have it.
	Rows int64
}

// OldestRow is the oldest row not yet delivered.
type OldestRow struct {
	ID         int64
	MessageKey string
	Status     Status
	CreatedAt  time.Time
	// Age is how long ago the row was created, by the database clock.
	Age time.Duration
}

// Stats is what `forwarder outbox stats` shows.
type Stats struct {
	// Rows counts rows by status; every status is present, 0 when absent.
	Rows map[Status]int64
	// Total is the number of rows.
	Total int64
	// Oldest is the oldest PENDING or IN_PROGRESS row; nil when there is none.
	Oldest *OldestRow
	// FailureReasons are the most frequent last_error values of FAILED rows.
	FailureReasons []ValueCount
	// FailureErrcodes are the most frequent platform errcodes of FAILED rows:
	// the platform_errcode of each row's latest attempt log ("" when none).
	FailureErrcodes []ValueCount
	// Ordering counts the rows held behind an earlier row of their key and
	// the keys blocked by a FAILED row.
	Ordering OrderingStats
	// Platform is the state every instance shares: the breaker, a pause.
	Platform PlatformState
	// Compensation splits the rows FAILED on transient errors: those
	// automatic requeue will still take (Waiting) and those it is done with
	// (Frozen).
	Compensation struct{ Waiting, Frozen int64 }
}

// StatsOptions shape ReadStats.
type StatsOptions struct {
	// Top bounds the top-N lists (10 when 0).
	Top int
	// RequeueRounds is the number of automatic requeues a row gets
	// (FAILED_REQUEUE_ROUNDS), which splits waiting rows from frozen ones.
	RequeueRounds int
}

// ReadStats reads the outbox statistics in one read-only snapshot, so the
// numbers agree with each other.
func ReadStats(ctx context.Context, db TxBeginner, opts StatsOptions) (Stats, error) {
	top := opts.Top
	if top <= 0 {
		top = 10
	}
	st := Stats{Rows: map[Status]int64{
		StatusPending: 0, StatusInProgress: 0, StatusSuccess: 0, StatusFailed: 0,
	}}
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, statsStatusSQL)
		if err != nil {
			return fmt.Errorf("counting rows by status: %w", err)
		}
		var status string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
			st.Rows[Status(status)] = n
			st.Total += n
			return nil
		}); err != nil {
			return fmt.Errorf("counting rows by status: %w", err)
		}

		var o OldestRow
		var dbNow time.Time
		err = tx.QueryRow(ctx, statsOldestSQL).Scan(&o.ID, &o.MessageKey, &status, &o.CreatedAt, &dbNow)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("finding the oldest undelivered row: %w", err)
		default:
			o.Status = Status(status)
			o.Age = dbNow.Sub(o.CreatedAt)
			st.Oldest = &o
		}

		if st.FailureReasons, err = topValues(ctx, tx, statsReasonsSQL, top); err != nil {
			return fmt.Errorf("counting failure reasons: %w", err)
		}
		if st.FailureErrcodes, err = topValues(ctx, tx, statsErrcodesSQL, top); err != nil {
			return fmt.Errorf("counting failure errcodes: %w", err)
		}
		if st.Ordering, err = readOrderingStats(ctx, tx, top); err != nil {
			return err
		}
		if st.Platform, err = ReadPlatformState(ctx, tx); err != nil {
			return err
		}
		st.Compensation.Waiting, st.Compensation.Frozen, err = CompensationCounts(ctx, tx, opts.RequeueRounds)
		return err
	})
	return st, err
}

func topValues(ctx context.Context, q Querier, sql string, top int) ([]ValueCount, error) {
	rows, err := q.Query(ctx, sql, top)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanValueCount)
}

// scanValueCount reads a (value, rows) row.
func scanValueCount(row pgx.CollectableRow) (ValueCount, error) {
	var v ValueCount
	err := row.Scan(&v.Value, &v.Rows)
	return v, err
}

// RequeueFilter selects the rows `forwarder outbox requeue` sets back to
// PENDING. Conditions combine with AND.
type RequeueFilter struct {
	// Statuses the rows may have; empty means FAILED. IN_PROGRESS rows are
	// taken only once their lease has expired (their holder is gone).
	Statuses []Status
	// Errcode, when set, keeps rows whose latest attempt log (LEASE_EXPIRED
	// and REQUEUED rows aside) has this platform_errcode.
	Errcode *string
	// UpdatedWithin, when positive, keeps rows updated within this long.
	UpdatedWithin time.Duration
	// Keys, when not empty, keeps rows with one of these message keys.
	Keys []string
	// Classes are the failure classes of the FAILED rows to requeue; empty
	// means TRANSIENT only, so a row the platform refused for good
	// (REJECTED) or one that failed at ingest or in its mapping (INVALID) is
	// requeued only when its class is asked for. FAILED rows without a
	// class (from before classes existed) are always taken.
	Classes []FailureClass
	// Reason, when set, keeps rows whose normalised last_error
	// (FailedGroup.Reason) is this.
	Reason *string
}

// MinPurgeAge is the shortest retention `forwarder outbox purge` accepts
// without --force. A delivered row's key is what makes a Kafka redelivery of
// its message harmless (the insert finds the key and does nothing); once the
// row is purged, a redelivery (a consumer group reset, a replay, a rebalance
// after a crash that re-reads uncommitted offsets) is persisted and sent
// again. A day covers the redeliveries of ordinary operation.
const MinPurgeAge = 24 * time.Hour

func (f RequeueFilter) args() ([]any, error) {
	statuses := f.Statuses
	if len(statuses) == 0 {
		statuses = []Status{StatusFailed}
	}
	ss := make([]string, len(statuses))
	for i, s := range statuses {
		switch s {
		case StatusPending, StatusInProgress, StatusSuccess, StatusFailed:
		default:
			return nil, fmt.Errorf("unknown status %q: want PENDING, IN_PROGRESS, SUCCESS or FAILED", s)
		}
		ss[i] = string(s)
	}
	classes := []string{string(ClassTransient)}
	if len(f.Classes) > 0 {
		classes = classes[:0]
	}
	for _, c := range f.Classes {
		switch c {
		case ClassTransient, ClassRejected, ClassInvalid:
			classes = append(classes, string(c))
		default:
			return nil, fmt.Errorf("unknown failure class %q: want TRANSIENT, REJECTED or INVALID", c)
		}
	}
	if err := cmp.Or(CheckText("errcode", textOf(f.Errcode)), CheckText("reason", textOf(f.Reason)), CheckText("key", f.Keys...)); err != nil {
		return nil, err
	}
	var within, keys any
	if f.UpdatedWithin < 0 {
		return nil, fmt.Errorf("updated-within %s is negative", f.UpdatedWithin)
	}
	if f.UpdatedWithin > 0 {
		within = f.UpdatedWithin.Milliseconds()
	}
	if len(f.Keys) > 0 {
		keys = f.Keys
	}
	return []any{ss, f.Errcode, within, keys, classes, f.Reason}, nil
}

// Validate says what is wrong with the filter, as Requeue and CountRequeue
// would, without a database.
func (f RequeueFilter) Validate() error {
	_, err := f.args()
	return err
}

func textOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// RequeueCount is what CountRequeue found.
type RequeueCount struct {
	// Rows is how many rows Requeue would requeue now.
	Rows int64
	// LeftRejected and LeftInvalid count the FAILED rows that match the
	// filter but are left out for their class (RequeueFilter.Classes).
	LeftRejected, LeftInvalid int64
}

// CountRequeue counts the rows Requeue would requeue now, and those it
// leaves out for their failure class.
func CountRequeue(ctx context.Context, q Querier, f RequeueFilter) (RequeueCount, error) {
	args, err := f.args()
	if err != nil {
		return RequeueCount{}, err
	}
	var c RequeueCount
	if err := q.QueryRow(ctx, requeueCountSQL, args...).Scan(&c.Rows, &c.LeftRejected, &c.LeftInvalid); err != nil {
		return RequeueCount{}, fmt.Errorf("counting rows to requeue: %w", err)
	}
	return c, nil
}

// RequeueOptions tunes Requeue.
type RequeueOptions struct {
	// BatchSize is how many rows one transaction requeues (default
	// DefaultAdminBatchSize).
	BatchSize int
	// Note starts each audit row's error_message (default "requeued by operator").
	Note string
}

// Requeue sets the rows matching f back to PENDING, due now, with
// attempt_count 0 and no claim, in batches. Each batch writes one REQUEUED
// row per record into forward_retry_logs and notifies NotifyChannel in the
// same transaction, so dispatchers wake as soon as it commits. It returns how
// many rows it requeued; on error, the batches already committed stay.
//
// A requeued row with an ordering key is held behind its key's head, or a
// row blocking the key, or an earlier row of the same batch, so the rows of
// a key keep their id order (see admin_requeue.sql). Each batch holds the
// ordering barrier exclusively (order_lock.sql): inserts and result writes
// of ordered rows wait for it, which is what lets a requeue picked by
// filters see its keys as they are.
func Requeue(ctx context.Context, db TxBeginner, f RequeueFilter, opts RequeueOptions) (int64, error) {
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	batch := opts.BatchSize
	if batch <= 0 {
		batch = DefaultAdminBatchSize
	}
	note := opts.Note
	if note == "" {
		note = "requeued by operator"
	}
	var total, lastID int64
	for {
		var n int64
		err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if !skipOrderLocks {
				if _, err := tx.Exec(ctx, orderBarrierExclusive); err != nil {
					return fmt.Errorf("taking the ordering barrier: %w", err)
				}
			}
			// admin_requeue.sql: the filter and classes ($1-$6, as
			// admin_requeue_count.sql), then the batch ($7-$9).
			batchArgs := append(append([]any{}, args...), lastID, batch, note)
			if err := tx.QueryRow(ctx, requeueSQL, batchArgs...).Scan(&n, &lastID); err != nil {
				return err
			}
			return notifyRequeued(ctx, tx, n)
		})
		if err != nil {
			return total, fmt.Errorf("requeueing rows after id %d: %w", lastID, err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if !slices.Contains(args[0].([]string), string(StatusSuccess)) || f.Reason != nil {
		return total, nil
	}
	// Delivered messages have no delivery row: they get one.
	for lastID = 0; ; {
		var n, picked int64
		err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, requeueDoneSQL, args[1], args[2], args[3], lastID, batch, note).Scan(&n, &lastID, &picked); err != nil {
				return err
			}
			return notifyRequeued(ctx, tx, n)
		})
		if err != nil {
			return total, fmt.Errorf("requeueing delivered messages after id %d: %w", lastID, err)
		}
		total += n
		if picked == 0 {
			return total, nil
		}
	}
}

// notifyRequeued wakes the dispatchers on NotifyChannel when a batch
// requeued rows; PostgreSQL sends it when tx commits, so a dispatcher never
// looks before the rows are due.
func notifyRequeued(ctx context.Context, tx pgx.Tx, n int64) error {
	if n == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_notify($1, 'requeued')", NotifyChannel)
	return err
}

// Progress counts the rows created after some id, by where they are in their
// life: what the dev stack prints each second.
type Progress struct {
	// Persisted counts every row.
	Persisted int64
	// Waiting rows are PENDING and never attempted; Retrying rows are
	// PENDING after at least one attempt; InProgress rows are claimed.
	Waiting, Retrying, InProgress int64
	// Delivered rows are SUCCESS, Failed rows FAILED.
	Delivered, Failed int64
}

// MaxRecordID is the highest message id (0 when none): the mark after which
// ReadProgress counts.
func MaxRecordID(ctx context.Context, q Querier) (int64, error) {
	var id int64
	if err := q.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM forward_messages").Scan(&id); err != nil {
		return 0, fmt.Errorf("reading the last record id: %w", err)
	}
	return id, nil
}

// UnsentUpTo counts the rows with an id up to lastID that are still to be
// sent (PENDING or IN_PROGRESS): for the dev stack, the rows earlier runs
// left. forward_deliveries holds only unfinished and FAILED rows, so this
// reads no delivered row.
func UnsentUpTo(ctx context.Context, q Querier, lastID int64) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM forward_deliveries
		WHERE status IN ('PENDING', 'IN_PROGRESS') AND id <= $1`, lastID).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the rows still to send: %w", err)
	}
	return n, nil
}

// ReadProgress counts the rows with an id above afterID by status.
func ReadProgress(ctx context.Context, q Querier, afterID int64) (Progress, error) {
	var p Progress
	if err := q.QueryRow(ctx, progressSQL, afterID).Scan(&p.Persisted, &p.Waiting, &p.Retrying, &p.InProgress, &p.Delivered, &p.Failed); err != nil {
		return p, fmt.Errorf("counting rows by status: %w", err)
	}
	return p, nil
}
