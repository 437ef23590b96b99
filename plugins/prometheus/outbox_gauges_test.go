package prometheus

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	"github.com/forwarder/forwarder/internal/testsupport/tcpproxy"
)

// insertRows adds n rows in status through SQL, after one attempt each:
// their messages, and a delivery state for the unfinished ones (due dueIn
// from now) or a SUCCESS attempt for the delivered ones.
func insertRows(t testing.TB, pool *pgxpool.Pool, prefix, status string, n int, dueIn time.Duration) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `WITH m AS (
		INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
		SELECT $1 || '-' || g, 'HEARTBEAT', 'device-heartbeat', 0, g, convert_to('{"n":' || g || '}', 'UTF8')
		FROM generate_series(1, $3::integer) g
		RETURNING id, created_at, message_key, octet_length(payload) AS size
		), d AS (
		INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, next_retry_at, payload_size)
		SELECT id, created_at, message_key, $2, 1,
		       CASE WHEN $2 IN ('PENDING', 'IN_PROGRESS') THEN now() + $4 * interval '1 millisecond' END, size
		FROM m
		WHERE $2 <> 'SUCCESS'
		)
		INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status)
		SELECT id, created_at, 1, 'SUCCESS', 200 FROM m WHERE $2 = 'SUCCESS'`,
		prefix, status, n, dueIn.Milliseconds()); err != nil {
		t.Fatalf("inserting %s rows: %v", status, err)
	}
}

// countsByStatus is SELECT status, count(*) ... GROUP BY status.
func countsByStatus(t testing.TB, pool *pgxpool.Pool) map[string]float64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT status, count(*) FROM forward_records GROUP BY status")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	counts := map[string]float64{"PENDING": 0, "IN_PROGRESS": 0, "SUCCESS": 0, "FAILED": 0}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		counts[s] = float64(n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// recordGauges picks the four record gauges out of a scrape, by status.
func recordGauges(fams map[string]*dto.MetricFamily) map[string]float64 {
	got := map[string]float64{}
	for status, name := range map[string]string{
		"PENDING": metricRecordsPending, "IN_PROGRESS": metricRecordsInProgress,
		"SUCCESS": metricRecordsSuccess, "FAILED": metricRecordsFailed,
	} {
		if f := fams[name]; f != nil && len(f.GetMetric()) == 1 && len(f.GetMetric()[0].GetLabel()) == 0 {
			got[status] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return got
}

func gather(t testing.TB, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, f := range fs {
		fams[f.GetName()] = f
	}
	return fams
}

func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

type refresherBundle struct {
	dsn  string
	pool *pgxpool.Pool
	o    *outboxGauges
	logs *logBuffer
}

// setupRefresher builds a refresher on dsn (a fresh database when empty),
// without starting its loop: tests call runOnce.
func setupRefresher(t *testing.T, dsn string) *refresherBundle {
	t.Helper()
	if dsn == "" {
		dsn = pgtest.NewDB(t)
	}
	// A password the server ignores (trust auth) must never reach a log.
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "s3cret-pw")
	dsn = u.String()

	pool, err := outboxdb.Open(context.Background(), dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	poolCfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	log, logs := newTestLogger()
	o := newOutboxGauges(outboxGaugesConfig{RefreshInterval: time.Hour, Timeout: 5 * time.Second}, poolCfg, log)
	t.Cleanup(func() {
		o.stop()
		if strings.Contains(logs.String(), "s3cret-pw") {
			t.Errorf("the DSN's password reached the log:\n%s", logs)
		}
	})
	return &refresherBundle{dsn: dsn, pool: pool, o: o, logs: logs}
}

func TestOutboxGauges(t *testing.T) {
	t.Parallel()

	t.Run("RunOnceServesTheSnapshot", func(t *testing.T) {
		t.Parallel()
		b := setupRefresher(t, "")
		if fams := gather(t, b.o); len(fams) != 0 {
			t.Fatalf("series before the first refresh: %v", keys(fams))
		}
		insertRows(t, b.pool, "p", "PENDING", 4, -2*time.Minute)
		insertRows(t, b.pool, "i", "IN_PROGRESS", 3, time.Minute)
		insertRows(t, b.pool, "s", "SUCCESS", 6, 0)
		insertRows(t, b.pool, "f", "FAILED", 2, 0)

		res, err := b.o.runOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Gauges.Pending != 4 || res.Took <= 0 {
			t.Errorf("result %+v", res)
		}
		fams := gather(t, b.o)
		if got, want := recordGauges(fams), countsByStatus(t, b.pool); !equalCounts(got, want) {
			t.Errorf("record gauges %v, want %v", got, want)
		}
		if age := fams[metricOldestPendingAge].GetMetric()[0].GetGauge().GetValue(); age < 120 || age > 3600 {
			t.Errorf("%s = %v, want the 120 s the PENDING rows have been due", metricOldestPendingAge, age)
		}
		if ts := fams[metricGaugesLastRefresh].GetMetric()[0].GetGauge().GetValue(); ts < float64(time.Now().Add(-time.Hour).Unix()) {
			t.Errorf("%s = %v", metricGaugesLastRefresh, ts)
		}

		// Scrapes serve the snapshot until the next refresh.
		insertRows(t, b.pool, "f2", "FAILED", 5, 0)
		if got := recordGauges(gather(t, b.o))["FAILED"]; got != 2 {
			t.Errorf("FAILED = %v between refreshes, want the snapshot's 2", got)
		}
		if _, err := b.o.runOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := recordGauges(gather(t, b.o))["FAILED"]; got != 7 {
			t.Errorf("FAILED = %v after a refresh, want 7", got)
		}
	})

	t.Run("DatabaseOutageKeepsTheLastSnapshot", func(t *testing.T) {
		t.Parallel()
		c := pgtest.StartCluster(t)
		b := setupRefresher(t, pgtest.NewDBOn(t, c))
		insertRows(t, b.pool, "p", "PENDING", 3, time.Minute)
		if _, err := b.o.runOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		before := recordGauges(gather(t, b.o))

		if err := c.Stop("fast"); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := b.o.runOnce(context.Background()); err == nil {
				t.Fatal("refresh succeeded with the server down")
			}
		}
		if got := recordGauges(gather(t, b.o)); !equalCounts(got, before) {
			t.Errorf("gauges during the outage %v, want the last snapshot %v", got, before)
		}
		if n := b.logs.count("WARN", "refresh failed"); n != 1 {
			t.Errorf("%d warnings for 3 failed refreshes, want 1:\n%s", n, b.logs)
		}

		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := b.o.runOnce(context.Background())
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("refresh never recovered after the server came back: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n := b.logs.count("INFO", "refreshed again"); n != 1 {
			t.Errorf("%d recovery messages, want 1:\n%s", n, b.logs)
		}
		pool, err := outboxdb.Open(context.Background(), b.dsn, outboxdb.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		insertRows(t, pool, "f", "FAILED", 2, 0)
		if _, err := b.o.runOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, want := recordGauges(gather(t, b.o)), countsByStatus(t, pool); !equalCounts(got, want) {
			t.Errorf("gauges after recovery %v, want %v", got, want)
		}
	})
}

// TestOutboxGaugesLoop runs the ticker loop; sequential, so that goleak
// sees only its own goroutines.
func TestOutboxGaugesLoop(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs after every other cleanup.
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setupRefresher(t, "")
	b.o.cfg.RefreshInterval = 20 * time.Millisecond
	b.o.start()
	insertRows(t, b.pool, "s", "SUCCESS", 3, 0)
	insertRows(t, b.pool, "f", "FAILED", 1, 0)
	want := countsByStatus(t, b.pool)

	deadline := time.Now().Add(30 * time.Second)
	for !equalCounts(recordGauges(gather(t, b.o)), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the loop never served %v; got %v", want, recordGauges(gather(t, b.o)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutboxGaugesSlowLink: on a loaded machine or a distant database a
// refresh can take longer than a short refresh interval. A refresh bounded
// by the interval alone was cut every time and never served a snapshot.
func TestOutboxGaugesSlowLink(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = tcpproxy.New(t, u.Host, tcpproxy.Options{ReplyDelay: 200 * time.Millisecond}).Addr()
	poolCfg, err := outboxdb.ParsePoolConfig(u.String(), outboxdb.PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	log, _ := newTestLogger()
	o := newOutboxGauges(outboxGaugesConfig{RefreshInterval: 50 * time.Millisecond}, poolCfg, log)
	o.start()
	t.Cleanup(o.stop)

	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, ok := o.snapshot(); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no refresh finished over a link answering 200ms late with a 50ms interval")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
