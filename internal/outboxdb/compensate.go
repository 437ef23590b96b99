package outboxdb

import (
	"context"
	"fmt"
	"time"
)

var (
	compensateSQL       = mustSQL("compensate.sql")
	compensateCountsSQL = mustSQL("compensate_counts.sql")
)

// Compensate requeues, in batches of batchSize, the rows FAILED on
// transient errors at least after ago and requeued fewer than rounds times
// (see compensate.sql), and returns how many it requeued.
func Compensate(ctx context.Context, q Querier, rounds int, after time.Duration, batchSize int) (int64, error) {
	var total int64
	for {
		var n, notified int64
		if err := q.QueryRow(ctx, compensateSQL, rounds, after.Milliseconds(), batchSize, NotifyChannel).Scan(&n, &notified); err != nil {
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
