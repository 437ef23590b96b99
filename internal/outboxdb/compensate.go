package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxRequeueRounds is the most automatic requeues a row may be given: the
// count of a row's rounds is an integer column.
const MaxRequeueRounds = math.MaxInt32

// Compensate requeues, in batches of batchSize, the rows FAILED on
// transient errors at least after ago and requeued fewer than rounds times
// (see compensate.sql), and returns how many it requeued. Each batch's
// candidates are read first, without locks; their ordering keys are locked
// in the same round trip as the requeue (order_lock.sql), so a requeued row
// of an ordered key waits behind the key's head like any other.
func Compensate(ctx context.Context, q Querier, rounds int, after time.Duration, batchSize int) (int64, error) {
	var total int64
	for {
		rows, err := q.Query(ctx, compensatePickSQL, rounds, after.Milliseconds(), batchSize)
		if err != nil {
			return total, fmt.Errorf("finding failed rows to requeue: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return total, fmt.Errorf("finding failed rows to requeue: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		var n, notified int64
		err = queryLocked(ctx, q, nil, ids, compensateSQL, []any{rounds, after.Milliseconds(), batchSize, NotifyChannel, ids},
			func(rows pgx.Rows) error {
				if !rows.Next() {
					return errors.New("no result row")
				}
				return rows.Scan(&n, &notified)
			})
		if err != nil {
			return total, fmt.Errorf("requeueing failed rows: %w", err)
		}
		total += n
		if n < int64(batchSize) {
			return total, nil
		}
	}
}

// CompensationCounts counts the rows FAILED on transient errors that
// compensation will still requeue (waiting) and those it is done with
// (frozen).
func CompensationCounts(ctx context.Context, q Querier, rounds int) (waiting, frozen int64, err error) {
	if err := q.QueryRow(ctx, compensateCountsSQL, rounds).Scan(&waiting, &frozen); err != nil {
		return 0, 0, fmt.Errorf("counting rows failed on transient errors: %w", err)
	}
	return waiting, frozen, nil
}
