package dispatch

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

// renewTimeout bounds one renewal statement.
const renewTimeout = 10 * time.Second

// renewInterval is how often the renewal looks for leases to renew: an
// eighth of the lease. It takes those that end within half a lease, so
// each row is written about once per half lease (a renewal is a new row
// version), while a held row has four chances to be renewed before its
// lease runs out: three renewals may fail or come late in a row (a
// database away, a starved machine) and the claim still holds.
func (d *Dispatcher) renewInterval() time.Duration {
	return max(d.cfg.Lease/8, 10*time.Millisecond)
}

// renewLoop renews, every renewInterval, the leases of held rows that end
// within half a lease, in one statement, until ctx ends.
func (d *Dispatcher) renewLoop(ctx context.Context, pool *pgxpool.Pool) *periodic.Loop {
	return periodic.Start(ctx, periodic.Config{Interval: d.renewInterval()}, func(ctx context.Context) {
		if _, err := d.renewOnce(ctx, pool); err != nil && ctx.Err() == nil {
			d.log.Warnf("Renewing claim leases failed (retrying in %v; rows whose lease runs out are sent with a shorter timeout or go back unsent): %v", d.renewInterval(), err)
		}
	})
}

// renewResult is what one renewal did.
type renewResult struct {
	Asked, Renewed, Lost int
}

// renewOnce renews the leases that end within half a lease.
func (d *Dispatcher) renewOnce(ctx context.Context, pool *pgxpool.Pool) (renewResult, error) {
	asked := d.ledger.Expiring(time.Now().Add(d.cfg.Lease / 2))
	if len(asked) == 0 {
		d.markRenewed()
		return renewResult{}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, renewTimeout)
	defer cancel()
	until := d.leaseBound()
	renewed, err := outboxdb.RenewLeases(rctx, pool, asked, d.cfg.Lease)
	if err != nil {
		return renewResult{Asked: len(asked)}, err
	}
	d.markRenewed()
	if len(renewed) < len(asked) {
		asked = d.withoutSettled(rctx, pool, asked, renewed)
	}
	lost := d.ledger.Renewed(asked, renewed, until)
	if d.m.Renewed != nil {
		d.m.Renewed.Incr(int64(len(renewed)))
	}
	if lost > 0 {
		if d.m.Lost != nil {
			d.m.Lost.Incr(int64(lost))
		}
		d.log.Warnf("%d held claims were lost (their lease had run out and the rows were claimed again, or requeued): they will not be sent by this instance", lost)
	}
	return renewResult{Asked: len(asked), Renewed: len(renewed), Lost: lost}, nil
}

// withoutSettled leaves out of asked the claims the renewal did not renew
// but that are not lost: this instance's output had already written their
// result (the acknowledgement that settles them in the ledger comes after
// the write), or the row was locked at that moment (most likely by that
// result write) and is renewed at the next look. When the check fails they
// are judged lost, which only keeps the output from sending them.
func (d *Dispatcher) withoutSettled(ctx context.Context, pool *pgxpool.Pool, asked []outboxdb.ClaimRef, renewed map[int64]time.Time) []outboxdb.ClaimRef {
	var missing []outboxdb.ClaimRef
	for _, r := range asked {
		if _, ok := renewed[r.ID]; !ok {
			missing = append(missing, r)
		}
	}
	settled, err := outboxdb.SettledClaims(ctx, pool, missing, d.cfg.Claimer)
	if err != nil {
		d.log.Debugf("%v", err)
		return asked
	}
	kept := asked[:0:0]
	for _, r := range asked {
		if !settled[r.ID] {
			kept = append(kept, r)
		}
	}
	return kept
}

func (d *Dispatcher) markRenewed() {
	d.mu.Lock()
	d.renewOK = time.Now()
	d.mu.Unlock()
}

// Claim states, as LeaseFor reports them.
const (
	// LeaseUnknown: the dispatcher does not hold that claim (the message came
	// from elsewhere); rely on the lease the message carries.
	LeaseUnknown = iota
	// LeaseHeld: held, and kept alive by renewals while they succeed.
	LeaseHeld
	// LeaseLost: a renewal found the row claimed by someone else; it must
	// not be sent.
	LeaseLost
)

// LeaseFor says whether the dispatcher holds ref and until when. renewing
// is true while renewals succeed on time: the lease then moves on before it
// runs out, and a request may take its whole timeout.
func (d *Dispatcher) LeaseFor(ref outboxdb.ClaimRef) (state int, deadline time.Time, renewing bool) {
	deadline, ok := d.ledger.Lease(ref)
	if !ok {
		if d.ledger.holds(ref) {
			return LeaseLost, time.Time{}, false
		}
		return LeaseUnknown, time.Time{}, false
	}
	return LeaseHeld, deadline, d.renewing()
}

// renewing is true while the dispatcher is connected and its renewals
// succeed on time: the last one within half a lease, so that a lease taken
// now is renewed before it runs out.
func (d *Dispatcher) renewing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.closed && d.pool != nil && time.Since(d.renewOK) < d.cfg.Lease/2
}
