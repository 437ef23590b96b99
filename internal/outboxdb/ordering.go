package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Per-key ordering (docs/architecture.md, "Ordering"): rows with the same
// ordering_key are delivered one at a time, in id order. A row that must
// wait for an earlier one of its key is held (order_held): PENDING but not
// due, out of the claim's index. Whatever changes which rows of a key hold
// it (an insert, a result write that finishes a head, a release, the
// repair) first locks the key in a statement of its own (order_lock.sql).

const orderBarrierExclusive = "SELECT pg_advisory_xact_lock(1869767778, 0)"

// OrderOnFailed says what a row that ends FAILED does to the rows of its
// ordering key held behind it.
type OrderOnFailed string

const (
	// OrderSkip releases the next row, as a SUCCESS would; the released row's
	// attempt log says so (ORDER_RELEASED). The default.
	OrderSkip OrderOnFailed = "skip"
	// OrderBlock keeps the key held by the FAILED row (order_blocked) until
	// an operator requeues it or releases the key (`forwarder outbox
	// release`).
	OrderBlock OrderOnFailed = "block"
)

// ParseOrderOnFailed reads "skip" or "block"; "" is skip.
func ParseOrderOnFailed(s string) (OrderOnFailed, error) {
	switch OrderOnFailed(s) {
	case "", OrderSkip:
		return OrderSkip, nil
	case OrderBlock:
		return OrderBlock, nil
	}
	return "", fmt.Errorf("%q is not skip or block", s)
}

// OrderLockSQL is the key-lock statement, exported for tests.
func OrderLockSQL() string { return orderLockSQL }

// skipOrderLocks leaves the key locks out, for the tests that show what
// they prevent (export_test.go).
var skipOrderLocks bool

// queryLocked runs sql with args after the key-lock statement for the
// ordering keys keys and the keys of the rows ids, in one pipeline: one
// round trip, and one implicit transaction (or the caller's, when q is a
// transaction), so the locks are held until sql's work commits and sql's
// snapshot is taken after they were granted. Without keys and ids it runs
// sql alone. each reads sql's rows.
func queryLocked(ctx context.Context, q Querier, keys []string, ids []int64, sql string, args []any, each func(pgx.Rows) error) error {
	return pipeline(ctx, q, step{orderLockSQL, []any{keys, ids}, len(keys)+len(ids) > 0},
		step{sql, args, true}, step{}, each)
}

// queryInsertLocked is queryLocked for insert.sql: keys, one per ordered
// record, go to order_lock_active.sql, which locks the keys whose rows the
// insert may hold; insert_backstop.sql follows it, with the batch's message
// keys (msgKeys), in the same transaction.
func queryInsertLocked(ctx context.Context, q Querier, keys []string, sql string, args []any, msgKeys []string, each func(pgx.Rows) error) error {
	lock := step{orderLockActiveSQL, []any{keys}, len(keys) > 0}
	switch {
	case skipOrderLocks:
		lock.sql = skipLocksSQL
	}
	return pipeline(ctx, q, lock, step{sql, args, true}, step{insertBackstopSQL, []any{msgKeys}, true}, each)
}

// skipLocksSQL stands for order_lock_active.sql when the locks are left out
// (tests): it declares every key locked, so insert.sql holds rows as if.
const skipLocksSQL = `SELECT set_config('forwarder.order_locked',
	coalesce((SELECT string_agg(DISTINCT hashtext(k)::text, ',') FROM unnest($1::text[]) k WHERE k <> ''), ''), true)`

// step is one statement of a pipeline; run false leaves it out.
type step struct {
	sql  string
	args []any
	run  bool
}

// pipeline runs before, main and after (those whose run is set) in one
// pipeline: one round trip, one implicit transaction (or the caller's when
// q is a transaction). each reads main's rows; the others' results are
// discarded, their errors returned. Behind a pooler the statements go
// through their functions (viaFunctions); should one have been dropped,
// the error says so and the next run sends the statements themselves.
func pipeline(ctx context.Context, q Querier, before, main, after step, each func(pgx.Rows) error) error {
	if skipOrderLocks && before.sql == orderLockSQL {
		before.run = false
	}
	viaFunctions(q, &before.sql, &main.sql, &after.sql)
	return fallBackFromFunctions(q, runPipeline(ctx, q, before, main, after, each))
}

func runPipeline(ctx context.Context, q Querier, before, main, after step, each func(pgx.Rows) error) error {
	for i, a := range before.args {
		switch v := a.(type) {
		case []string:
			if v == nil {
				before.args[i] = []string{}
			}
		case []int64:
			if v == nil {
				before.args[i] = []int64{}
			}
		}
	}
	if !before.run && !after.run {
		rows, err := q.Query(ctx, main.sql, main.args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := each(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	b := &pgx.Batch{}
	if before.run {
		b.Queue(before.sql, before.args...)
	}
	b.Queue(main.sql, main.args...)
	if after.run {
		b.Queue(after.sql, after.args...)
	}
	br := q.SendBatch(ctx, b)
	if before.run {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("locking ordering keys: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return err
	}
	err = each(rows)
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err == nil && after.run {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockOrderKeys takes the key locks in their own statement, inside the
// caller's transaction tx.
func lockOrderKeys(ctx context.Context, tx pgx.Tx, keys []string, ids []int64) error {
	if skipOrderLocks {
		return nil
	}
	if keys == nil {
		keys = []string{}
	}
	if ids == nil {
		ids = []int64{}
	}
	if _, err := tx.Exec(ctx, orderLockSQL, keys, ids); err != nil {
		return fmt.Errorf("locking ordering keys: %w", err)
	}
	return nil
}

// KeyRelease is what ReleaseKey did, or would do.
type KeyRelease struct {
	// Key is the ordering key.
	Key string
	// Unblocked are the FAILED rows that no longer block the key.
	Unblocked []int64
	// Promoted is the held row released, due now; 0 when none (nothing was
	// held behind the key, or it is still held by another row).
	Promoted int64
	// StillHeld says the key is still held by a head or another blocked row.
	StillHeld bool
}

// ReleaseOptions says which blocked row ReleaseKey releases.
type ReleaseOptions struct {
	// Key names the ordering key; when empty, ID's key.
	Key string
	// ID, when set, releases only this FAILED row (which must block its key);
	// otherwise every blocked row of Key.
	ID int64
	// Operator is written to the audit log and the released row's attempt
	// log.
	Operator string
	// DryRun does everything in a transaction that is rolled back: the result
	// says what a release would do now.
	DryRun bool
}

// ErrNotBlocked is returned by ReleaseKey when nothing blocks the key.
var ErrNotBlocked = errors.New("no FAILED row blocks it")

// ReleaseKey ends the block of an ordering key held by a FAILED row
// (on_failed: block): the row stays FAILED but no longer holds the key, and
// the next row held behind it is promoted, due now (order_release.sql). One
// transaction: the key is locked first, like every statement that changes
// which rows of a key hold it.
func ReleaseKey(ctx context.Context, db TxBeginner, o ReleaseOptions) (KeyRelease, error) {
	if o.Key == "" && o.ID == 0 {
		return KeyRelease{}, errors.New("releasing an ordering key: name the key or the blocked row's id")
	}
	if o.Operator == "" {
		o.Operator = "unknown"
	}
	var res KeyRelease
	errRollback := errors.New("dry run")
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		key := o.Key
		if o.ID != 0 {
			var rowKey *string
			var status string
			var blocked bool
			err := tx.QueryRow(ctx, `SELECT ordering_key, status, order_blocked FROM forward_deliveries WHERE id = $1`, o.ID).
				Scan(&rowKey, &status, &blocked)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				// No delivery state: delivered, or no such row.
				var delivered bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM forward_messages WHERE id = $1)`, o.ID).Scan(&delivered); err != nil {
					return err
				}
				if delivered {
					return fmt.Errorf("row %d was delivered (SUCCESS): it holds no ordering key", o.ID)
				}
				return fmt.Errorf("row %d does not exist", o.ID)
			case err != nil:
				return err
			case rowKey == nil:
				return fmt.Errorf("row %d has no ordering key", o.ID)
			case key != "" && key != *rowKey:
				return fmt.Errorf("row %d has ordering key %q, not %q", o.ID, *rowKey, key)
			case status != string(StatusFailed) || !blocked:
				res.Key = *rowKey
				return fmt.Errorf("row %d is %s and not blocking: %w", o.ID, status, ErrNotBlocked)
			}
			key = *rowKey
		}
		res.Key = key
		if err := lockOrderKeys(ctx, tx, []string{key}, nil); err != nil {
			return err
		}
		var id *int64
		if o.ID != 0 {
			id = &o.ID
		}
		var promoted *int64
		var notified int64
		if err := tx.QueryRow(ctx, orderReleaseSQL, key, id, o.Operator, NotifyChannel).
			Scan(&res.Unblocked, &promoted, &res.StillHeld, &notified); err != nil {
			return err
		}
		if promoted != nil {
			res.Promoted = *promoted
		}
		if len(res.Unblocked) == 0 {
			if o.ID != 0 {
				return fmt.Errorf("row %d is not the FAILED row blocking it: %w", o.ID, ErrNotBlocked)
			}
			return ErrNotBlocked
		}
		if o.DryRun {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	switch {
	case err == nil:
		return res, nil
	case res.Key != "":
		return res, fmt.Errorf("releasing ordering key %q: %w", res.Key, err)
	default:
		return res, fmt.Errorf("releasing the ordering key of row %d: %w", o.ID, err)
	}
}

// RepairedRow is a held row the ordering repair released.
type RepairedRow struct {
	ID  int64
	Key string
}

// DefaultRepairLimit bounds the keys one RepairOrdering run looks at.
const DefaultRepairLimit = 1000

// RepairOrdering releases held rows whose key nothing holds (no head, no
// blocked row): the first held row of each such key is promoted, due now,
// with an ORDER_RELEASED attempt log. The lock protocol never leaves a key
// that way; this is the safety net for what it cannot see (a row changed by
// hand, a bug). The search reads one index probe per active key, without
// locks; keys found are locked and checked again before anything changes.
// limit bounds the keys handled (DefaultRepairLimit when <= 0).
func RepairOrdering(ctx context.Context, db TxBeginner, limit int) ([]RepairedRow, error) {
	if limit <= 0 {
		limit = DefaultRepairLimit
	}
	var keys []string
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, orderRepairFindSQL, limit)
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("looking for held rows without a head: %w", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	var repaired []RepairedRow
	err = pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := lockOrderKeys(ctx, tx, keys, nil); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, orderRepairSQL, keys, NotifyChannel)
		if err != nil {
			return err
		}
		var r RepairedRow
		var notified int64
		_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.Key, &notified}, func() error {
			repaired = append(repaired, r)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("releasing held rows without a head: %w", err)
	}
	return repaired, nil
}

// BlockedKey is an ordering key blocked by a FAILED row.
type BlockedKey struct {
	Key string
	// ID and MessageKey name the FAILED row that blocks it.
	ID         int64
	MessageKey string
	// FailedAt is when the row failed; Age how long ago, by the database
	// clock.
	FailedAt  time.Time
	Age       time.Duration
	LastError string
	// Held counts the rows waiting behind it.
	Held int64
}

// OrderingStats is the ordering part of `forwarder outbox stats`.
type OrderingStats struct {
	// HeldRows are PENDING rows held behind an earlier row of their key.
	HeldRows int64
	// BlockedKeys counts keys blocked by a FAILED row; Blocked lists the
	// longest blocked ones.
	BlockedKeys int64
	Blocked     []BlockedKey
}

// readOrderingStats reads the ordering statistics inside the caller's
// snapshot; top bounds the list of blocked keys.
func readOrderingStats(ctx context.Context, q Querier, top int) (OrderingStats, error) {
	var st OrderingStats
	if err := q.QueryRow(ctx, `SELECT (SELECT count(*) FROM forward_deliveries WHERE order_held),
			(SELECT count(DISTINCT ordering_key) FROM forward_deliveries WHERE order_blocked)`).
		Scan(&st.HeldRows, &st.BlockedKeys); err != nil {
		return st, fmt.Errorf("counting held rows and blocked keys: %w", err)
	}
	if st.BlockedKeys == 0 {
		return st, nil
	}
	rows, err := q.Query(ctx, orderStatsBlockedSQL, top)
	if err != nil {
		return st, fmt.Errorf("listing blocked keys: %w", err)
	}
	var (
		b      BlockedKey
		failed *time.Time
		dbNow  time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&b.Key, &b.ID, &b.MessageKey, &failed, &dbNow, &b.LastError, &b.Held}, func() error {
		if failed != nil {
			b.FailedAt, b.Age = *failed, dbNow.Sub(*failed)
		}
		st.Blocked = append(st.Blocked, b)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("listing blocked keys: %w", err)
	}
	return st, nil
}

// orderLockKeys lists the ordering keys of the PENDING records among
// recs[idx...], one per record (order_lock_active.sql counts them).
func orderLockKeys(recs []NewRecord, idx []int) []string {
	var keys []string
	for _, i := range idx {
		if k := orderingKeyOf(&recs[i]); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// isOrderConflict says the insert failed because a key it did not lock
// gained an active row meanwhile: insert.sql's refusal to hold a row behind
// it (forward_records_order_conflict), or a second head refused by the
// unique index when another inserter made the key's first row concurrently
// (the violation is reported once that inserter committed). Nothing was
// committed; run the insert again: it then sees the row and locks the key.
func isOrderConflict(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return (pgErr.Code == "40001" && (strings.Contains(pgErr.Message, "gained an active row") ||
		strings.Contains(pgErr.Message, "stored by another transaction while this insert ran"))) ||
		(pgErr.Code == "23505" && pgErr.ConstraintName == "forward_deliveries_order_head_key")
}

// OrderLockActiveSQL is the insert's key-lock statement, exported for
// tests.
func OrderLockActiveSQL() string { return orderLockActiveSQL }

// orderingKeyOf is the ordering key a record is stored with: FAILED rows are
// never ordered.
func orderingKeyOf(r *NewRecord) string {
	if r.Status == StatusFailed {
		return ""
	}
	return r.OrderingKey
}
