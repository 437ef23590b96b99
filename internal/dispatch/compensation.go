package dispatch

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/internal/plural"
)

// CompensationConfig configures automatic compensation: rows FAILED
// because their attempts ran out on transient or unavailable replies are
// requeued After their failure, at most Rounds times. Zero After: off.
type CompensationConfig struct {
	After  time.Duration
	Rounds int
}

// compensationBatch is how many rows one statement requeues.
const compensationBatch = 500

// compensationInterval is how often compensation looks for rows: a quarter
// of the delay, between a second and a minute, so that a row is requeued
// close to its time without reading the index too often.
func (c CompensationConfig) interval() time.Duration {
	return min(max(c.After/4, time.Second), time.Minute)
}

// compensationLoop requeues due rows now and every interval until ctx
// ends.
func (d *Dispatcher) compensationLoop(ctx context.Context, pool *pgxpool.Pool) *periodic.Loop {
	return periodic.Start(ctx, periodic.Config{Interval: d.cfg.Compensation.interval(), Now: true}, func(ctx context.Context) {
		if _, err := d.compensateOnce(ctx, pool); err != nil && ctx.Err() == nil {
			d.log.Warnf("Automatic compensation of failed rows: %v (trying again in %v)", err, d.cfg.Compensation.interval())
		}
	})
}

// compensateOnce requeues what is due and refreshes the gauges of rows
// waiting for a round and frozen ones.
func (d *Dispatcher) compensateOnce(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	c := d.cfg.Compensation
	n, err := outboxdb.Compensate(ctx, pool, c.Rounds, c.After, compensationBatch)
	if n > 0 {
		if d.m.Compensated != nil {
			d.m.Compensated.Incr(n)
		}
		d.log.Infof("Automatic compensation: requeued %s that had failed on transient errors at least %v ago", plural.Count(n, "row", "rows"), c.After)
		d.claimNeeded.Store(true)
		signal(d.nudge)
	}
	if err != nil {
		return n, err
	}
	waiting, frozen, err := outboxdb.CompensationCounts(ctx, pool, c.Rounds)
	if err != nil {
		return n, err
	}
	if d.m.CompensationWaiting != nil {
		d.m.CompensationWaiting.Set(waiting)
	}
	if d.m.Frozen != nil {
		d.m.Frozen.Set(frozen)
	}
	return n, nil
}
