package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// retentionConfig is the outbox_retry input's optional periodic cleaner.
type retentionConfig struct {
	// OlderThan: SUCCESS rows delivered longer ago than this are deleted,
	// with their attempt logs.
	OlderThan time.Duration
	// Interval is the time between two runs; the first runs at Connect.
	Interval time.Duration
	// BatchSize is how many rows one transaction deletes.
	BatchSize int
}

// retentionResult is what one run of the cleaner did.
type retentionResult struct {
	// Skipped is true when another instance held the retention lock: this
	// run deleted nothing and left the work to it.
	Skipped bool
	outboxdb.PurgeResult
}

// retention deletes delivered rows on a schedule. Of several instances
// configured alike, the one holding the retention advisory lock purges and
// the others skip their turn (outboxdb.TryPurge).
type retention struct {
	cfg  retentionConfig
	pool *pgxpool.Pool
	// session is the direct connection's settings behind a transaction
	// pooler (the lock is held there), nil otherwise.
	session *pgx.ConnConfig
	log     *service.Logger

	// onProgress, a test hook set before start, runs after each deleted
	// batch while the lock is held.
	onProgress func(outboxdb.PurgeResult)

	mu   sync.Mutex
	stop context.CancelFunc
	done chan struct{}
}

func newRetention(cfg retentionConfig, pool *pgxpool.Pool, session *pgx.ConnConfig, log *service.Logger) *retention {
	return &retention{cfg: cfg, pool: pool, session: session, log: log}
}

// runOnce purges once, if no other instance is purging.
func (r *retention) runOnce(ctx context.Context) (retentionResult, error) {
	res, locked, err := outboxdb.TryPurgeWithSession(ctx, r.pool, r.session, outboxdb.PurgeOptions{
		OlderThan: r.cfg.OlderThan,
		BatchSize: r.cfg.BatchSize,
		Progress:  r.onProgress,
	})
	out := retentionResult{Skipped: !locked, PurgeResult: res}
	if err != nil {
		return out, fmt.Errorf("purging rows delivered more than %s ago (%d deleted before the error): %w",
			outboxdb.FormatDuration(r.cfg.OlderThan), res.Records, err)
	}
	return out, nil
}

// start runs the cleaner in the background until close: once now, then
// every interval.
func (r *retention) start() {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.mu.Lock()
	r.stop, r.done = stop, done
	r.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.Interval)
		defer t.Stop()
		for {
			r.runAndLog(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

func (r *retention) runAndLog(ctx context.Context) {
	res, err := r.runOnce(ctx)
	if res.Records > 0 {
		r.log.Infof("Retention: deleted %d SUCCESS rows delivered before %s and %d attempt logs, in %d batches",
			res.Records, res.Cutoff.UTC().Format(time.RFC3339), res.Logs, res.Batches)
	}
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
		// Shutting down: a purge cut short is finished by the next run.
	case err != nil:
		r.log.Errorf("Retention: %v; trying again in %s", err, r.cfg.Interval)
	case res.Skipped:
		r.log.Debugf("Retention: another instance holds the retention lock, skipping this run")
	}
}

// close stops the loop, cancelling a run under way, and waits for it.
func (r *retention) close() {
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}
