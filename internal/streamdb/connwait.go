package streamdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// How Connect waits for an unreachable outbox database: attempts spaced by a
// delay that doubles from connectRetryInitial up to connectRetryMax. Each
// attempt is bounded by the pool's connect timeout (10 s unless the DSN
// sets connect_timeout).
const (
	connectRetryInitial = time.Second
	connectRetryMax     = 30 * time.Second
	// outageLogEvery is how often a wait that goes on is logged again.
	outageLogEvery = 5 * time.Minute
)

// connectDelay is the wait after the n-th failed attempt (n ≥ 1).
func connectDelay(n int, initial, limit time.Duration) time.Duration {
	d := initial
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// outage is what a DB knows of its database being unreachable, shared by
// the components that wait for it, so that one wait is logged once (and
// again every outageLogEvery), not once per component and attempt.
type outage struct {
	mu       sync.Mutex
	since    time.Time // zero: reachable
	attempts int
	logged   time.Time
}

// failed records a failed attempt of h's and logs it when it starts an
// outage or when the last line about it is outageLogEvery old; the other
// attempts go to debug. (Their errors differ in little but the client's
// port, so a changed reason is not a reason to log.)
func (o *outage) failed(h *DB, err error, next, limit time.Duration) {
	why := oneLine(err)
	log, database := h.log, h.Database
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.attempts++
	switch {
	case o.since.IsZero():
		o.since, o.logged = now, now
		retrying := fmt.Sprintf("with backoff (%v, doubling up to %v)", h.retryInitial, limit)
		if limit <= h.retryInitial {
			retrying = fmt.Sprintf("every %v", limit)
		}
		log.Warnf("Waiting for the outbox database %s: %s; nothing is claimed, sent or persisted until it answers. "+
			"Retrying %s, logged again every %v while it lasts",
			database, why, retrying, outageLogEvery)
	case now.Sub(o.logged) >= outageLogEvery:
		o.logged = now
		log.Warnf("Still waiting for the outbox database %s after %s and %d attempts (next in %v): %s",
			database, now.Sub(o.since).Round(time.Second), o.attempts, next, why)
	default:
		log.Debugf("Outbox database %s still unreachable (attempt %d, next in %v): %s", database, o.attempts, next, why)
	}
}

// recovered logs the end of an outage, once.
func (o *outage) recovered(log *service.Logger, database string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return
	}
	log.Infof("The outbox database %s answers again, after %s and %d failed attempts", database,
		time.Since(o.since).Round(time.Second), o.attempts)
	o.since, o.attempts = time.Time{}, 0
}

// oneLine is an error on one line: pgx lists one line per address tried
// (twice the same with sslmode=prefer), which a log line keeps once each.
func oneLine(err error) string {
	var b strings.Builder
	prev := ""
	for i, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line == prev {
			continue
		}
		if i > 0 && b.Len() > 0 && !strings.HasSuffix(b.String(), ":") {
			b.WriteString(";")
		}
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString(line)
		prev = line
	}
	return b.String()
}

// waitFor runs attempt until it succeeds, waiting between failures from
// h.retryInitial, doubling up to limit, and returns nil then, or ctx's error
// once ctx ends (shutdown). Benthos calls a component's Connect again after
// every error, logging "Failed to connect" each time, about once a second
// forever: waiting here instead says once what is awaited and keeps the
// attempts spaced.
func (h *DB) waitFor(ctx context.Context, limit time.Duration, attempt func(context.Context) error) error {
	for n := 1; ; n++ {
		err := attempt(ctx)
		if err == nil {
			h.outage.recovered(h.log, h.Database)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, outboxdb.ErrSchemaTooNew) || errors.Is(err, outboxdb.ErrSchemaElsewhere) {
			// Waiting would not help: this binary is too old for the
			// schema, or the outbox is where the session does not look.
			return err
		}
		delay, upTo := connectDelay(n, h.retryInitial, limit), limit
		if errors.Is(err, outboxdb.ErrMigrationRunning) {
			// Not an outage: another instance (or outbox migrate) is
			// migrating, and the schema is ready the moment it commits.
			// Instances started together with the one migrating waited
			// up to the doubled delay after it, idle. Look every
			// h.retryInitial instead, and back off afresh after.
			delay, upTo, n = h.retryInitial, h.retryInitial, 0
		}
		h.outage.failed(h, err, delay, upTo)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// Recheck is what Connect does when called again after a lost connection
// on a pool it already holds: it waits until the database answers again
// and takes writes, as Open does, but trying every h.retryInitial without
// backing off. A running instance holds claimed rows and leases, and
// consumes: while it waits, its rows wait for it, so it follows a restarted
// or promoted database within a second of its coming back rather than at
// the end of a doubled delay (a 5 s failover met the next attempt 2 s late,
// its rows' leases long over). A query a second is nothing to a database.
func (h *DB) Recheck(ctx context.Context, pool *pgxpool.Pool) error {
	return h.waitFor(ctx, h.retryInitial, func(ctx context.Context) error {
		if err := outboxdb.CheckWritable(ctx, pool); err != nil {
			return fmt.Errorf("reconnecting: %w", err)
		}
		return nil
	})
}
