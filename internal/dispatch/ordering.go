package dispatch

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

const (
	// orderRepairInterval is how often the dispatcher looks for rows held
	// behind nothing. The lock protocol never leaves any (docs/architecture.md,
	// "Ordering"), so this is a slow safety net, one walk of the ordering
	// index a minute.
	orderRepairInterval = time.Minute
	// orderRepairTimeout bounds one repair.
	orderRepairTimeout = 30 * time.Second
)

// RecordResults writes the results of rows d dispatched (d may be nil: no
// dispatcher in the stream) with the stream's ordering policy, and hands
// the rows the write releases to d at once, claimed in the same statement
// (chained dispatch, see outboxdb.RecordOptions.Chain): the next event of a
// berth costs no claim and no wake-up. Without a dispatcher the released
// rows are only made due. d's ledger notes the claims written, so that
// their acknowledgement settles them (Dispatcher.Done).
func RecordResults(ctx context.Context, q outboxdb.Querier, d *Dispatcher, results []outboxdb.Result) ([]int64, error) {
	if d == nil {
		return outboxdb.RecordResults(ctx, q, results, outboxdb.RecordOptions{})
	}
	finishing := 0
	for _, r := range results {
		if r.Status == outboxdb.StatusSuccess || r.Status == outboxdb.StatusFailed {
			finishing++
		}
	}
	opts := d.RecordOptions()
	g := d.ledger.ReserveChain(finishing, time.Now())
	g.until = d.leaseBound()
	opts.Chain = d.DirectClaim()
	opts.Chain.Limit = g.Rows
	out, err := outboxdb.RecordResultsChained(ctx, q, results, opts)
	if err != nil {
		d.ledger.Deliver(g, nil)
		return nil, err
	}
	d.ledger.Recorded(results)
	if !d.Deliver(g, out.Claimed) && len(out.Claimed) > 0 {
		// Closed meanwhile: give them back as if never claimed.
		refs := make([]outboxdb.ClaimRef, len(out.Claimed))
		for i, r := range out.Claimed {
			refs[i] = r.Ref()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if _, err := outboxdb.ReleaseUnsent(rctx, q, refs); err != nil {
			d.log.Warnf("Could not give back %d rows claimed for a dispatcher that stopped (they come back when their lease expires): %v", len(refs), err)
		}
	}
	return out.Recorded, nil
}

// orderRepairLoop runs orderRepairOnce every orderRepairInterval until ctx
// ends.
func (d *Dispatcher) orderRepairLoop(ctx context.Context, pool *pgxpool.Pool) *periodic.Loop {
	return periodic.Start(ctx, periodic.Config{Interval: orderRepairInterval}, func(ctx context.Context) {
		if _, err := d.orderRepairOnce(ctx, pool); err != nil && ctx.Err() == nil {
			d.log.Warnf("Looking for held rows without a head failed (trying again in %v): %v", orderRepairInterval, err)
		}
	})
}

// orderRepairOnce releases the held rows whose ordering key nothing holds,
// counts them in forwarder_ordering_repairs_total and logs them: each one
// is a bug or a row changed by hand, worth a look.
func (d *Dispatcher) orderRepairOnce(ctx context.Context, pool *pgxpool.Pool) ([]outboxdb.RepairedRow, error) {
	rctx, cancel := context.WithTimeout(ctx, orderRepairTimeout)
	defer cancel()
	repaired, err := outboxdb.RepairOrdering(rctx, pool, outboxdb.DefaultRepairLimit)
	if err != nil || len(repaired) == 0 {
		return nil, err
	}
	if d.m.OrderRepairs != nil {
		d.m.OrderRepairs.Incr(int64(len(repaired)))
	}
	const show = 10
	shown := repaired[:min(len(repaired), show)]
	d.log.Warnf("Released %d held rows whose ordering key nothing held (no head, no blocked row; a row changed by hand?): %+v", len(repaired), shown)
	d.claimNeeded.Store(true)
	signal(d.nudge)
	return repaired, nil
}
