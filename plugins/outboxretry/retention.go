package outboxretry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

// retentionConfig is the outbox_retry input's optional retention.
type retentionConfig struct {
	// OlderThan: partitions whose range ended longer ago than this are
	// retired once every message in them is finished.
	OlderThan time.Duration
	// Interval is the time between two runs; the first runs at Connect.
	Interval time.Duration
	// DeadLetter: FAILED rows not yet published to the dead-letter topic
	// keep their partition.
	DeadLetter bool
}

// retentionResult is what one run of the retention did.
type retentionResult struct {
	// Skipped is true when another instance held the retention lock: this
	// run retired nothing and left the work to it.
	Skipped bool
	outboxdb.PurgeResult
}

// maxEnsureInterval caps the time between two runs of the partition
// upkeep: partitions are kept three widths ahead, so even hourly ones have
// hours of margin.
const maxEnsureInterval = time.Hour

// manyPartitions is how many partitions the upkeep lets accumulate with
// retention off before it warns: every insert looks each message's key up in
// every partition (docs/architecture.md, "Dedupe across partitions"), so
// past a few dozen the lookups cost more than the insert itself
// (docs/operations.md, "Retention").
const manyPartitions = 60

// maintenance is the outbox_retry input's background work on the database:
// it keeps partitions created ahead (on every instance: the database
// serialises the creations, docs/architecture.md "Partitions") and, when
// configured, retires old partitions. Of several instances configured
// alike, the one holding the retention advisory lock retires and the others
// skip their turn (outboxdb.TryPurge).
type maintenance struct {
	width time.Duration
	// retention is nil when retention is off.
	retention *retentionConfig
	pool      *pgxpool.Pool
	// session is the direct connection's settings behind a transaction
	// pooler (the lock is held there), nil otherwise.
	session *pgx.ConnConfig
	log     *service.Logger

	// onProgress, a test hook set before start, runs after each partition
	// of a retention run while the lock is held.
	onProgress func(outboxdb.PartitionOutcome)
	// ensureEvery, a test hook set before start, replaces ensureInterval.
	ensureEvery time.Duration

	mu sync.Mutex
	// loops run the upkeep and the retention, each on its interval: a long
	// retention run does not hold up the partitions ahead.
	loops []*periodic.Loop
}

func newMaintenance(width time.Duration, retention *retentionConfig, pool *pgxpool.Pool, session *pgx.ConnConfig, log *service.Logger) *maintenance {
	return &maintenance{width: width, retention: retention, pool: pool, session: session, log: log}
}

// ensureInterval is the time between two runs of the partition upkeep: a
// quarter of a width, at most maxEnsureInterval.
func (m *maintenance) ensureInterval() time.Duration {
	if m.ensureEvery > 0 {
		return m.ensureEvery
	}
	return min(m.width/4, maxEnsureInterval)
}

// ensure creates the partitions of the current time and PartitionsAhead
// widths after it that do not exist yet.
func (m *maintenance) ensure(ctx context.Context) (int, error) {
	n, err := outboxdb.EnsurePartitions(ctx, m.pool, m.width)
	if err != nil {
		return n, fmt.Errorf("keeping %s partitions ahead: %w", outboxdb.FormatDuration(m.width), err)
	}
	return n, nil
}

// runOnce retires old partitions once, if no other instance is doing it.
func (m *maintenance) runOnce(ctx context.Context) (retentionResult, error) {
	res, locked, err := outboxdb.TryPurgeWithSession(ctx, m.pool, m.session, outboxdb.PurgeOptions{
		OlderThan:  m.retention.OlderThan,
		DeadLetter: m.retention.DeadLetter,
		Operator:   "retention",
		Progress:   m.onProgress,
	})
	out := retentionResult{Skipped: !locked, PurgeResult: res}
	if err != nil {
		parts, _, _ := res.Retired()
		return out, fmt.Errorf("retiring partitions older than %s (%d retired before the error): %w",
			outboxdb.FormatDuration(m.retention.OlderThan), parts, err)
	}
	return out, nil
}

// start runs the upkeep in the background until close: the retention once
// now (the partitions were ensured by Connect), then each on its interval.
func (m *maintenance) start() {
	loops := []*periodic.Loop{periodic.Start(context.Background(), periodic.Config{Interval: m.ensureInterval()}, m.ensureAndLog)}
	if m.retention != nil {
		loops = append(loops, periodic.Start(context.Background(), periodic.Config{Interval: m.retention.Interval, Now: true}, m.retainAndLog))
	}
	m.mu.Lock()
	m.loops = loops
	m.mu.Unlock()
}

func (m *maintenance) ensureAndLog(ctx context.Context) {
	n, err := m.ensure(ctx)
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
	case err != nil:
		m.log.Errorf("Partitions: %v; trying again in %s", err, m.ensureInterval())
	case n > 0:
		m.log.Infof("Partitions: created %d partitions of %s ahead", n, outboxdb.FormatDuration(m.width))
		m.warnIfMany(ctx)
	}
}

// warnIfMany warns, with retention off, once more than manyPartitions are
// kept; it runs when partitions were created, so once per width at most.
func (m *maintenance) warnIfMany(ctx context.Context) {
	if m.retention != nil {
		return
	}
	ps, err := outboxdb.ListPartitions(ctx, m.pool)
	if err != nil || len(ps) <= manyPartitions {
		return
	}
	m.log.Warnf("Partitions: %d partitions are kept (from %s) and retention is off: every insert looks each message's key up in all of them, so each one kept makes inserts slower; set OUTBOX_RETENTION (docs/operations.md, Retention)",
		len(ps), ps[0].Label())
}

func (m *maintenance) retainAndLog(ctx context.Context) {
	res, err := m.runOnce(ctx)
	if parts, msgs, failed := res.Retired(); parts > 0 {
		var days []string
		for _, p := range res.Partitions {
			if p.Outcome == outboxdb.PartitionRetired && p.Messages > 0 {
				days = append(days, p.Label())
			}
		}
		m.log.Infof("Retention: retired %d partitions created before %s (%d messages, %d of them FAILED)%s",
			parts, res.Cutoff.UTC().Format(time.RFC3339), msgs, failed, listed(days))
	}
	if kept := res.Kept(); len(kept) > 0 {
		why := make([]string, len(kept))
		for i, p := range kept {
			why[i] = p.Label() + ": " + p.Why()
		}
		m.log.Infof("Retention: kept %d partitions older than %s: %s", len(kept),
			outboxdb.FormatDuration(m.retention.OlderThan), strings.Join(why, "; "))
	}
	switch {
	case err != nil && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
		// Shutting down: what is left is retired by the next run.
	case err != nil:
		m.log.Errorf("Retention: %v; trying again in %s", err, m.retention.Interval)
	case res.Skipped:
		m.log.Debugf("Retention: another instance holds the retention lock, skipping this run")
	}
}

// listed is ": a, b" for a non-empty list.
func listed(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return ": " + strings.Join(s, ", ")
}

// close stops the loops, cancelling the runs under way, and waits for them.
func (m *maintenance) close() {
	m.mu.Lock()
	loops := m.loops
	m.mu.Unlock()
	for _, l := range loops {
		l.Stop()
	}
}
