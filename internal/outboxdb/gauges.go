package outboxdb

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultExactSuccessMaxPages is the heap size (in 8 KiB pages, so 10 MiB)
// up to which ReadRecordGauges counts SUCCESS rows exactly.
const DefaultExactSuccessMaxPages = 1280

// SuccessSource says how RecordGauges.Success was obtained.
type SuccessSource string

// Sources of the SUCCESS gauge, from the most to the least accurate.
const (
	// SuccessExact is a count(*) of the SUCCESS rows (small tables only).
	SuccessExact SuccessSource = "exact"
	// SuccessStats is the statistics system's live-row count
	// (pg_stat_user_tables.n_live_tup) minus the exact unfinished counts.
	SuccessStats SuccessSource = "stats"
	// SuccessPlanner is the planner's row estimate scaled to the table's
	// current size (reltuples / relpages × pages), minus the exact unfinished
	// counts. Used when the statistics were reset (a crash, pg_stat_reset)
	// and the table has not been vacuumed or analysed since.
	SuccessPlanner SuccessSource = "planner"
)

// RecordGauges is a snapshot of forward_records for the record gauges.
type RecordGauges struct {
	// Pending, InProgress and Failed are exact.
	Pending, InProgress, Failed int64
	// Success is exact or an estimate, as SuccessSource says.
	Success       int64
	SuccessSource SuccessSource
	// OldestDueAge is how long the earliest-due row (a PENDING row whose
	// retry time has come, or an IN_PROGRESS row whose lease ran out) has
	// been waiting for a dispatcher; 0 when no row is due.
	OldestDueAge time.Duration
	// OrderHeld counts the rows held behind an earlier row of their
	// ordering key (they count in Pending too), OrderBlockedKeys the keys
	// blocked by a FAILED row; OldestHeldAge is how long the held row with
	// the lowest id has been held, OldestBlockedAge how long the longest
	// blocked key has been blocked (since its row failed), 0 when none is.
	OrderHeld, OrderBlockedKeys     int64
	OldestHeldAge, OldestBlockedAge time.Duration
	// TakenAt is the database's clock when the snapshot was read.
	TakenAt time.Time
}

// GaugeOptions tunes ReadRecordGauges. The zero value picks the defaults.
type GaugeOptions struct {
	// ExactSuccessMaxPages: while the message partitions have at most
	// this many pages, SUCCESS rows are counted exactly; above it they are
	// estimated. 0 means DefaultExactSuccessMaxPages; negative means never
	// count exactly.
	ExactSuccessMaxPages int64
}

// RecordGaugesSQL is the gauge statement, exported for plan tests.
func RecordGaugesSQL() string { return gaugesSQL }

// ReadRecordGauges reads the record gauges in one read-only snapshot. Its
// cost does not depend on the number of SUCCESS rows: see gauges.sql.
func ReadRecordGauges(ctx context.Context, db TxBeginner, opts GaugeOptions) (RecordGauges, error) {
	maxPages := cmp.Or(opts.ExactSuccessMaxPages, DefaultExactSuccessMaxPages)
	var (
		g             RecordGauges
		oldestDueSecs float64
		oldestHeld    float64
		oldestBlocked float64
		liveTuples    int64
		liveComplete  bool
		estimate      float64
		pages         int64
	)
	txOpts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	err := pgx.BeginTxFunc(ctx, db, txOpts, func(tx pgx.Tx) error {
		// A background gauge must not compete with the pipeline: with a large
		// backlog the planner's cost estimate crosses jit_above_cost and the
		// JIT compile would cost more than the query, and parallel workers
		// would take CPU from the dispatchers.
		if _, err := tx.Exec(ctx, "SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, gaugesSQL).Scan(&g.Pending, &g.InProgress, &g.Failed, &oldestDueSecs,
			&g.OrderHeld, &g.OrderBlockedKeys, &oldestHeld, &oldestBlocked, &liveTuples, &liveComplete, &estimate, &pages, &g.TakenAt); err != nil {
			return err
		}
		if maxPages >= 0 && pages <= maxPages {
			g.SuccessSource = SuccessExact
			return tx.QueryRow(ctx, gaugesSuccessExactSQL).Scan(&g.Success)
		}
		return nil
	})
	if err != nil {
		return RecordGauges{}, fmt.Errorf("reading outbox record gauges: %w", err)
	}
	g.OldestDueAge = time.Duration(oldestDueSecs * float64(time.Second))
	g.OldestHeldAge = time.Duration(oldestHeld * float64(time.Second))
	g.OldestBlockedAge = time.Duration(oldestBlocked * float64(time.Second))
	if g.SuccessSource == SuccessExact {
		return g, nil
	}

	// Every message is a live row of a partition; the undelivered ones
	// are counted exactly (their delivery rows), so SUCCESS is the rest.
	total := float64(liveTuples)
	g.SuccessSource = SuccessStats
	if !liveComplete {
		total = estimate
		g.SuccessSource = SuccessPlanner
	}
	g.Success = max(0, int64(math.Round(total))-g.Pending-g.InProgress-g.Failed)
	return g, nil
}
