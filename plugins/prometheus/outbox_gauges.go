package prometheus

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/periodic"
)

// Names of the outbox record gauges (docs/components.md).
const (
	metricRecordsPending     = "forwarder_records_pending"
	metricRecordsInProgress  = "forwarder_records_in_progress"
	metricRecordsSuccess     = "forwarder_records_success"
	metricRecordsFailed      = "forwarder_records_failed"
	metricOldestPendingAge   = "forwarder_oldest_pending_age_seconds"
	metricGaugesLastRefresh  = "forwarder_outbox_gauges_last_refresh_timestamp_seconds"
	metricOrderingHeld       = "forwarder_ordering_held_rows"
	metricOrderingBlocked    = "forwarder_ordering_blocked_keys"
	metricOrderingOldestHeld = "forwarder_ordering_oldest_held_age_seconds"
	metricOrderingBlockedAge = "forwarder_ordering_oldest_blocked_age_seconds"
	defaultRefreshInterval   = 15 * time.Second
	defaultRefreshTimeoutMin = 5 * time.Second
	defaultRefreshTimeoutMax = 30 * time.Second
)

// snapshotGauges are the gauges a snapshot serves, each with what it reads of
// it, in the order they are described and collected.
var snapshotGauges = []struct {
	desc  *prometheus.Desc
	value func(outboxdb.RecordGauges) float64
}{
	{gaugeDesc(metricRecordsPending, "Rows of forward_records in PENDING (exact, as of the last refresh)."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.Pending) }},
	{gaugeDesc(metricRecordsInProgress, "Rows of forward_records in IN_PROGRESS (exact, as of the last refresh)."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.InProgress) }},
	{gaugeDesc(metricRecordsSuccess, "Rows of forward_records in SUCCESS (exact on small tables, else estimated from PostgreSQL's statistics; see plugins/prometheus/README.md)."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.Success) }},
	{gaugeDesc(metricRecordsFailed, "Rows of forward_records in FAILED (exact, as of the last refresh)."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.Failed) }},
	{gaugeDesc(metricOldestPendingAge, "Seconds the earliest-due row (PENDING past its next_retry_at, or IN_PROGRESS past its lease) has waited for a dispatcher; 0 when none is due."),
		func(g outboxdb.RecordGauges) float64 { return g.OldestDueAge.Seconds() }},
	{gaugeDesc(metricOrderingHeld, "PENDING rows held behind an earlier row of their ordering key (a berth); they count in forwarder_records_pending too."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.OrderHeld) }},
	{gaugeDesc(metricOrderingBlocked, "Ordering keys blocked by a FAILED row (ORDER_ON_FAILED=block) until an operator requeues it or runs forwarder outbox release."),
		func(g outboxdb.RecordGauges) float64 { return float64(g.OrderBlockedKeys) }},
	{gaugeDesc(metricOrderingOldestHeld, "Seconds the held row with the lowest id has waited behind its key (since it was persisted or requeued); 0 when no row is held."),
		func(g outboxdb.RecordGauges) float64 { return g.OldestHeldAge.Seconds() }},
	{gaugeDesc(metricOrderingBlockedAge, "Seconds the longest blocked ordering key has been blocked (since its row became FAILED); 0 when none is."),
		func(g outboxdb.RecordGauges) float64 { return g.OldestBlockedAge.Seconds() }},
}

// descLastRefresh is served beside snapshotGauges: it reads the refresh time,
// not the snapshot.
var descLastRefresh = gaugeDesc(metricGaugesLastRefresh, "Unix time of the last successful refresh of the outbox record gauges.")

func gaugeDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, nil, nil)
}

// outboxGaugesConfig tunes the refresher.
type outboxGaugesConfig struct {
	// RefreshInterval is the time between two refreshes. Default 15s.
	RefreshInterval time.Duration
	// Timeout bounds one refresh. Default: RefreshInterval, at least 5s and
	// at most 30s. Bounded by a short interval alone, a refresh over a slow
	// link or on a loaded server was cut every time and never served.
	Timeout time.Duration
	// Gauge tunes the query (the exact-count threshold of SUCCESS).
	Gauge outboxdb.GaugeOptions
}

func (c outboxGaugesConfig) withDefaults() outboxGaugesConfig {
	c.RefreshInterval = cmp.Or(c.RefreshInterval, defaultRefreshInterval)
	c.Timeout = cmp.Or(c.Timeout, max(defaultRefreshTimeoutMin, min(c.RefreshInterval, defaultRefreshTimeoutMax)))
	return c
}

// refreshResult is what one refresh read.
type refreshResult struct {
	Gauges outboxdb.RecordGauges
	// Took is the refresh's wall time (query and round trips).
	Took time.Duration
}

// outboxGauges keeps a snapshot of the record gauges, refreshed in the
// background, and serves it as a prometheus.Collector: a scrape never
// touches the database.
type outboxGauges struct {
	cfg     outboxGaugesConfig
	log     *service.Logger
	poolCfg *pgxpool.Config

	// runMu serialises runOnce; it guards pool and failures.
	runMu    sync.Mutex
	pool     *pgxpool.Pool
	failures int

	snapMu      sync.RWMutex
	snap        *outboxdb.RecordGauges
	refreshedAt time.Time

	refresh *periodic.Loop
}

func newOutboxGauges(cfg outboxGaugesConfig, poolCfg *pgxpool.Config, log *service.Logger) *outboxGauges {
	return &outboxGauges{cfg: cfg.withDefaults(), poolCfg: poolCfg, log: log}
}

// runOnce reads a new snapshot. On failure the previous snapshot stays
// served; the first failure of a run of them is logged as a warning, the
// rest at debug level, and the recovery once.
func (o *outboxGauges) runOnce(ctx context.Context) (refreshResult, error) {
	o.runMu.Lock()
	defer o.runMu.Unlock()

	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	if o.pool == nil {
		// No connection is made here: the pool dials on the first query.
		pool, err := pgxpool.NewWithConfig(ctx, o.poolCfg)
		if err != nil {
			return refreshResult{}, o.failed(ctx, err)
		}
		o.pool = pool
	}
	g, err := outboxdb.ReadRecordGauges(ctx, o.pool, o.cfg.Gauge)
	if err != nil {
		return refreshResult{}, o.failed(ctx, err)
	}
	if o.failures > 0 {
		o.log.Infof("outbox record gauges: refreshed again after %d failed attempts", o.failures)
		o.failures = 0
	}
	o.snapMu.Lock()
	o.snap = &g
	o.refreshedAt = time.Now()
	o.snapMu.Unlock()
	return refreshResult{Gauges: g, Took: time.Since(start)}, nil
}

func (o *outboxGauges) failed(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err // shutting down
	}
	o.failures++
	if o.failures == 1 {
		o.log.Warnf("outbox record gauges: refresh failed, retrying every %v; scrapes serve the last snapshot meanwhile: %v", o.cfg.RefreshInterval, err)
	} else {
		o.log.Debugf("outbox record gauges: refresh failed again (%d in a row): %v", o.failures, err)
	}
	return err
}

// start runs a refresh now and then every RefreshInterval until stop.
func (o *outboxGauges) start() {
	o.refresh = periodic.Start(context.Background(), periodic.Config{Interval: o.cfg.RefreshInterval, Now: true},
		func(ctx context.Context) {
			_, _ = o.runOnce(ctx) // errors are logged by runOnce
		})
}

// stop ends the refresh loop and closes the pool. The snapshot stays served.
func (o *outboxGauges) stop() {
	o.refresh.Stop()
	o.runMu.Lock()
	defer o.runMu.Unlock()
	if o.pool != nil {
		o.pool.Close()
		o.pool = nil
	}
}

// snapshot returns the last snapshot, or false before the first refresh.
func (o *outboxGauges) snapshot() (outboxdb.RecordGauges, time.Time, bool) {
	o.snapMu.RLock()
	defer o.snapMu.RUnlock()
	if o.snap == nil {
		return outboxdb.RecordGauges{}, time.Time{}, false
	}
	return *o.snap, o.refreshedAt, true
}

// Describe implements prometheus.Collector.
func (o *outboxGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, r := range snapshotGauges {
		ch <- r.desc
	}
	ch <- descLastRefresh
}

// Collect implements prometheus.Collector: it serves the snapshot, nothing
// before the first successful refresh.
func (o *outboxGauges) Collect(ch chan<- prometheus.Metric) {
	g, at, ok := o.snapshot()
	if !ok {
		return
	}
	for _, r := range snapshotGauges {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, r.value(g))
	}
	ch <- prometheus.MustNewConstMetric(descLastRefresh, prometheus.GaugeValue, float64(at.UnixNano())/float64(time.Second))
}
