package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// The retention check: finished messages over daily partitions, then the
// oldest day retired as the service does it (outboxdb.Purge: the partition
// dropped) and the next day deleted row by row in batches, as the purge did
// before schema 5, each right after a checkpoint (every page it touches is
// logged whole, the worst case) on a server with production durability.
// Also the disk per million messages.
//
//	go run ./test/bench retention -rows 10000000 -days 10

type retentionBenchConfig struct {
	Rows        int
	Days        int
	FailedShare float64
	DeleteBatch int
	Dir         string
	Keep        bool
}

// retentionMeasure is the cost of retiring one day.
type retentionMeasure struct {
	Label    string
	Messages int64
	Took     time.Duration
	WAL      int64
	Batches  int
}

func runRetentionBench(ctx context.Context, args []string) error {
	var c retentionBenchConfig
	fs := flag.NewFlagSet("retention", flag.ContinueOnError)
	fs.IntVar(&c.Rows, "rows", 10_000_000, "finished messages to load, spread evenly over -days daily partitions")
	fs.IntVar(&c.Days, "days", 10, "days (partitions) the messages are spread over; at least 2")
	fs.Float64Var(&c.FailedShare, "failed-share", 0.001, "share of the messages that ended FAILED (the rest SUCCESS)")
	fs.IntVar(&c.DeleteBatch, "delete-batch", outboxdb.DefaultAdminBatchSize, "messages per transaction of the row-by-row DELETE compared")
	fs.StringVar(&c.Dir, "dir", "", "PostgreSQL cluster directory (default: a temporary directory)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the cluster's directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.Days < 2 || c.Rows < c.Days || c.DeleteBatch < 1 {
		return fmt.Errorf("retention: -days must be at least 2, -rows at least -days, -delete-batch at least 1")
	}

	pg, stop, err := privateCluster(ctx, c.Dir, "forwarder-retention-", c.Keep, pgcluster.Config{Durable: true, Settings: map[string]string{
		"max_wal_size": "8GB", "maintenance_work_mem": "512MB",
		// The WAL measured is the retirement's own.
		"autovacuum": "off",
	}})
	if err != nil {
		return err
	}
	defer stop()
	if err := ensureDB(ctx, pg, "retention"); err != nil {
		return err
	}
	pool, err := outboxdb.Open(ctx, pg.DSN("retention"), outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-bench-retention"})
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := outboxdb.Migrate(ctx, pool); err != nil {
		return err
	}

	start := time.Now()
	if err := loadDays(ctx, pool, c); err != nil {
		return err
	}
	logf("loaded %d messages over %d days in %s", c.Rows, c.Days, time.Since(start).Round(time.Second))
	var diskBytes int64
	if err := pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(relid))::bigint FROM (
			SELECT relid FROM pg_partition_tree('forward_messages') UNION ALL
			SELECT relid FROM pg_partition_tree('forward_retry_logs')) t`).Scan(&diskBytes); err != nil {
		return err
	}

	// The oldest day, dropped.
	var drop retentionMeasure
	if err := measureWAL(ctx, pool, &drop, func() error {
		res, err := outboxdb.Purge(ctx, pool, outboxdb.PurgeOptions{OlderThan: time.Duration(c.Days) * 24 * time.Hour, Operator: "bench"})
		parts, msgs, _ := res.Retired()
		drop.Messages, drop.Batches = msgs, parts
		if err == nil && parts != 1 {
			err = fmt.Errorf("retired %d partitions (%+v), want the oldest day", parts, res.Partitions)
		}
		return err
	}); err != nil {
		return fmt.Errorf("retiring the oldest day: %w", err)
	}
	drop.Label = "retire a day (drop its partition)"
	logf("%s: %d messages, %s, %d bytes of WAL", drop.Label, drop.Messages, drop.Took, drop.WAL)

	// The next day, row by row.
	var del retentionMeasure
	if err := measureWAL(ctx, pool, &del, func() error {
		return deleteDay(ctx, pool, c.DeleteBatch, &del)
	}); err != nil {
		return fmt.Errorf("deleting the next day row by row: %w", err)
	}
	del.Label = fmt.Sprintf("delete a day row by row (%d per transaction)", c.DeleteBatch)
	logf("%s: %d messages, %s, %d bytes of WAL", del.Label, del.Messages, del.Took, del.WAL)

	fmt.Println()
	fmt.Println(retentionMarkdown(c, diskBytes, []retentionMeasure{drop, del}))
	return nil
}

// loadDays writes c.Rows finished messages, each with a SUCCESS attempt log
// (a FAILED delivery row for c.FailedShare of them), spread over the c.Days
// whole days before yesterday, in statements of at most 500 000.
func loadDays(ctx context.Context, pool *pgxpool.Pool, c retentionBenchConfig) error {
	if _, err := pool.Exec(ctx, `SELECT forward_partition_ensure(date_trunc('day', now()) - $1::integer * interval '1 day',
		now(), interval '1 day')`, c.Days+1); err != nil {
		return err
	}
	perDay := c.Rows / c.Days
	const chunk = 500_000
	for d := range c.Days {
		for from := 0; from < perDay; from += chunk {
			n := min(chunk, perDay-from)
			if _, err := pool.Exec(ctx, `WITH m AS (
				INSERT INTO forward_messages (created_at, message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload,
				                              plate_no, park_code, berth_code, device_id)
				SELECT date_trunc('day', now()) - $1::integer * interval '1 day' + g * (86400e0 / $2::float8) * interval '1 second',
				       'ret-' || $1 || '-' || g, 'VEHICLE_EVENT', 'device-vehicle-event', g % 3, g,
				       convert_to(repeat('x', 480) || g, 'UTF8'),
				       'P' || (g % 5000), 'K' || (g % 100), 'B' || (g % 5000), 'CAM-' || (g % 2000)
				FROM generate_series($3::integer, $3::integer + $4::integer - 1) g
				RETURNING id, created_at, message_key
			), l AS (
				INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status, attempted_at)
				SELECT id, created_at, 1, 'SUCCESS', 200, created_at FROM m
			)
			INSERT INTO forward_deliveries (id, created_at, message_key, status, payload_size, failure_class, failed_at, last_error)
			SELECT id, created_at, message_key, 'FAILED', 490, 'REJECTED', created_at, 'errcode 998'
			FROM m
			WHERE random() < $5::float8`, c.Days+1-d, float64(perDay), from, n, c.FailedShare); err != nil {
				return err
			}
		}
		logf("day %d of %d loaded", d+1, c.Days)
	}
	for _, sql := range []string{"VACUUM (ANALYZE) forward_messages", "VACUUM (ANALYZE) forward_retry_logs", "VACUUM (ANALYZE) forward_deliveries"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// measureWAL runs f right after a checkpoint and records its duration and
// the WAL it wrote.
func measureWAL(ctx context.Context, pool *pgxpool.Pool, m *retentionMeasure, f func() error) error {
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	var before string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before); err != nil {
		return err
	}
	start := time.Now()
	if err := f(); err != nil {
		return err
	}
	m.Took = time.Since(start)
	return pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", before).Scan(&m.WAL)
}

// deleteDay deletes the messages of the oldest partition left, with their
// attempt logs and delivery rows, batch messages per transaction: what
// retention did before schema 5.
func deleteDay(ctx context.Context, pool *pgxpool.Pool, batch int, m *retentionMeasure) error {
	ps, err := outboxdb.ListPartitions(ctx, pool)
	if err != nil {
		return err
	}
	if len(ps) == 0 {
		return fmt.Errorf("no partition left")
	}
	p := ps[0]
	for {
		var n int64
		if err := pool.QueryRow(ctx, `WITH m AS (
				DELETE FROM forward_messages m
				WHERE (m.id, m.created_at) IN (SELECT id, created_at FROM forward_messages
				                               WHERE created_at >= $1 AND created_at < $2 ORDER BY id LIMIT $3)
				RETURNING m.id, m.created_at
			), l AS (
				DELETE FROM forward_retry_logs l USING m WHERE l.record_id = m.id AND l.record_created_at = m.created_at
			), d AS (
				DELETE FROM forward_deliveries d USING m WHERE d.id = m.id
			)
			SELECT count(*) FROM m`, p.Lower, p.Upper, batch).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		m.Messages += n
		m.Batches++
	}
}

func retentionMarkdown(c retentionBenchConfig, diskBytes int64, ms []retentionMeasure) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Retention: %d finished messages (%.1f %% FAILED) over %d daily partitions, each with one attempt log; durable server, right after a checkpoint.\n\n",
		c.Rows, 100*c.FailedShare, c.Days)
	fmt.Fprintf(&b, "Disk (messages and attempt logs, with indexes): %.0f MiB per million messages.\n\n",
		float64(diskBytes)/float64(c.Rows)*1e6/(1<<20))
	b.WriteString("| | messages | transactions | time | WAL |\n|---|---:|---:|---:|---:|\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %.2f MiB |\n", m.Label, m.Messages, m.Batches, m.Took.Round(time.Millisecond), float64(m.WAL)/(1<<20))
	}
	return b.String()
}
