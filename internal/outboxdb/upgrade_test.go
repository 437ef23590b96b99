package outboxdb_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// upgradeRowsEnv sets the number of schema-4 rows TestUpgradeToSchema5
// upgrades. The default keeps `make test` quick and still makes every kind
// of row many times over; the measured figure of docs/deployment.md
// ("Upgrading to schema 5") is a run with 1 000 000:
//
//	FORWARDER_UPGRADE_ROWS=1000000 go test ./internal/outboxdb -run TestUpgradeToSchema5 -v -timeout 60m
const upgradeRowsEnv = "FORWARDER_UPGRADE_ROWS"

const defaultUpgradeRows = 10_000

// schema4Seed fills a schema-4 database with $1 rows the way schema-4
// binaries left them, in every state, row g (1..$1) being kind g % 20 and
// variant (g / 20) of it:
//
//	0-8   SUCCESS, 1-3 attempts (retries logged), some ordered, some requeued
//	      by compensation before delivery
//	9     SUCCESS whose logs were purged (all, or the SUCCESS one), or
//	      delivered twice (requeued after its first delivery)
//	10-11 PENDING, retried or not, due or not
//	12    IN_PROGRESS, lease running or expired (a LEASE_EXPIRED log)
//	13-14 FAILED: TRANSIENT, REJECTED (errcode 998), INVALID; published to
//	      the dead-letter topic, claimed for it, given back, or neither
//	15/16 an ordering key's head and the row held behind it
//	17/18 a FAILED row blocking its key and the row held behind it
//	19    an IN_PROGRESS head of its key
//
// Payloads are ~500 bytes (some not UTF-8), a seventh of the rows have no
// Kafka key, the lookup columns are partly NULL. The first 0.4 % of the rows
// are 10-90 days old, the others spread over the last 10 days, ids and
// created_at in the same order as inserts leave them. Then, as retention
// and rolled-back inserts leave a database, the newest delivered rows are
// gone and both identity sequences are ahead of the largest id.
var schema4Seed = []string{
	`INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
	        kafka_key, payload, status, attempt_count, next_retry_at, last_http_status, last_error,
	        created_at, updated_at, succeeded_at, claim_token, claimed_by, claimed_at,
	        dead_lettered_at, dead_letter_token, dead_letter_lease_until,
	        plate_no, park_code, berth_code, device_id, ordering_key, order_held, order_blocked,
	        failure_class, failed_at, requeue_rounds, lease_returns)
	SELECT 'k-' || g, CASE WHEN g % 2 = 0 THEN 'VEHICLE_EVENT' ELSE 'HEARTBEAT' END,
	       'device-vehicle-event', g % 12, g,
	       CASE WHEN g % 7 <> 0 THEN convert_to('dev-' || g % 300, 'UTF8') END,
	       CASE WHEN g % 50 = 7 THEN '\xfffe00'::bytea || convert_to(repeat('z', 480), 'UTF8')
	            ELSE convert_to('{"messageId":"k-' || g || '","plateNo":"P' || g % 1000 || '","pad":"'
	                            || repeat('x', 440) || '"}', 'UTF8') END,
	       st, attempts,
	       CASE WHEN st = 'PENDING' THEN now() + ((g % 600) - 300) * interval '1 second'
	            WHEN st = 'IN_PROGRESS' AND v % 2 = 0 THEN now() + interval '50 seconds'
	            WHEN st = 'IN_PROGRESS' THEN now() - interval '5 seconds' END,
	       CASE WHEN st = 'SUCCESS' THEN 200 WHEN st = 'FAILED' AND class = 'REJECTED' THEN 200
	            WHEN attempts > 0 AND st <> 'IN_PROGRESS' AND class IS DISTINCT FROM 'INVALID' THEN 503 END,
	       CASE WHEN st = 'FAILED' AND class = 'INVALID' THEN 'payload is not valid JSON'
	            WHEN st = 'FAILED' AND class = 'REJECTED' THEN 'not retried (rules[1] no_retry): http 200'
	            WHEN st = 'FAILED' THEN 'giving up after 5 attempts: http 503'
	            WHEN st = 'PENDING' AND attempts > 0 THEN 'http 503' END,
	       created, created + interval '2 seconds',
	       CASE WHEN st = 'SUCCESS' THEN created + interval '2 seconds' END,
	       CASE WHEN attempts > 0 THEN gen_random_uuid() END,
	       CASE WHEN attempts > 0 THEN 'pod-' || g % 3 END,
	       CASE WHEN attempts > 0 THEN created + interval '1 second' END,
	       CASE WHEN st = 'FAILED' AND v % 4 = 0 THEN created + interval '3 seconds' END,
	       CASE WHEN st = 'FAILED' AND v % 4 = 1 THEN gen_random_uuid() END,
	       CASE WHEN st = 'FAILED' AND v % 4 = 1 THEN now() + interval '30 seconds'
	            WHEN st = 'FAILED' AND v % 4 = 2 THEN now() - interval '1 second' END,
	       CASE WHEN g % 3 <> 0 THEN 'P' || g % 1000 END,
	       CASE WHEN g % 4 <> 0 THEN 'park-' || g % 200 END,
	       CASE WHEN g % 5 <> 0 THEN 'b-' || g % 40 END,
	       CASE WHEN g % 2 = 0 THEN 'dev-' || g % 300 END,
	       CASE WHEN kind IN (15, 17, 19) THEN 'ok-' || g
	            WHEN kind IN (16, 18) THEN 'ok-' || g - 1
	            WHEN kind <= 8 AND g % 5 = 0 THEN 'done-' || g % 50 END,
	       kind IN (16, 18), kind = 17,
	       class,
	       CASE WHEN st = 'FAILED' OR (kind <= 8 AND g % 9 = 3) THEN created + interval '2 seconds' END,
	       CASE WHEN class = 'TRANSIENT' THEN v % 3 WHEN kind <= 8 AND g % 9 = 3 THEN 1 ELSE 0 END,
	       CASE WHEN st = 'PENDING' THEN g % 2 ELSE 0 END
	FROM (SELECT g, kind, v, st, class,
	             CASE WHEN st = 'SUCCESS' AND kind = 9 AND v % 3 = 2 THEN 1
	                  WHEN st = 'SUCCESS' THEN 1 + g % 3
	                  WHEN st = 'PENDING' AND kind IN (10, 11) THEN g % 3
	                  WHEN st = 'IN_PROGRESS' THEN 1 + g % 3
	                  WHEN class = 'INVALID' THEN 0
	                  WHEN class = 'REJECTED' THEN 1
	                  WHEN class = 'TRANSIENT' THEN 5
	                  ELSE 0 END AS attempts,
	             CASE WHEN g <= $1::integer / 250
	                  THEN now() - interval '90 days' + (g::float8 / greatest($1::integer / 250, 1)) * interval '80 days'
	                  ELSE now() - interval '10 days' + (g::float8 / $1::integer) * interval '10 days' END AS created
	      FROM (SELECT g, kind, v,
	                   CASE WHEN kind <= 9 THEN 'SUCCESS'
	                        WHEN kind IN (10, 11, 15, 16, 18) THEN 'PENDING'
	                        WHEN kind IN (12, 19) THEN 'IN_PROGRESS'
	                        ELSE 'FAILED' END AS st,
	                   CASE WHEN kind = 17 THEN 'TRANSIENT'
	                        WHEN kind IN (13, 14) THEN (ARRAY['TRANSIENT', 'REJECTED', 'INVALID'])[1 + v % 3] END AS class
	            FROM (SELECT g, g % 20 AS kind, g / 20 AS v FROM generate_series(1, $1::integer) g) AS n) AS k) AS r
	ORDER BY g`,

	// Retries before the last attempt, as record.sql logged them.
	`INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status, error_message,
	        duration_ms, attempted_at, next_retry_at)
	SELECT r.id, a, 'PENDING', 503, 'http 503', 40 + a, r.created_at + a * interval '10 milliseconds',
	       r.created_at + a * interval '1 second'
	FROM forward_records r, generate_series(1, r.attempt_count - 1) a
	WHERE NOT (r.kafka_offset % 20 = 9 AND (r.kafka_offset / 20) % 3 <> 1)
	  AND r.failure_class IS DISTINCT FROM 'REJECTED'
	ORDER BY r.id, a`,

	// Leases that ran out, compensation rounds, and a delivered row
	// requeued by an operator and delivered again (its first delivery,
	// the requeue, then the second one).
	`INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status, error_message,
	        attempted_at, next_retry_at)
	SELECT r.id, r.attempt_count - 1, 'LEASE_EXPIRED', NULL::integer,
	       'lease expired: attempt ' || r.attempt_count - 1 || ' by pod-1 left no result',
	       r.created_at + interval '500 milliseconds', NULL::timestamptz
	FROM forward_records r
	WHERE r.status = 'IN_PROGRESS' AND (r.kafka_offset / 20) % 4 = 1 AND r.attempt_count > 1
	UNION ALL
	SELECT r.id, 5, 'REQUEUED', NULL::integer, 'automatic compensation, round ' || n || ' of 3',
	       r.created_at + n * interval '1 minute', r.created_at + n * interval '1 minute'
	FROM forward_records r, generate_series(1, r.requeue_rounds) n
	WHERE r.status = 'FAILED'
	UNION ALL
	SELECT r.id, 1, x.st, x.http, x.msg, r.created_at + x.n * interval '100 milliseconds', NULL
	FROM forward_records r,
	     (VALUES (1, 'SUCCESS', 200, NULL::text),
	             (2, 'REQUEUED', NULL, 'requeued by operator (was SUCCESS after 1 attempts)')) AS x(n, st, http, msg)
	WHERE r.kafka_offset % 20 = 9 AND (r.kafka_offset / 20) % 3 = 2
	ORDER BY 1, 6`,
	// The last attempt of finished rows and of retried PENDING ones.
	`INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status,
	        platform_errcode, error_message, duration_ms, attempted_at, next_retry_at)
	SELECT r.id, r.attempt_count, CASE WHEN r.status = 'FAILED' THEN 'FAILED' ELSE r.status END,
	       r.last_http_status, CASE WHEN r.failure_class = 'REJECTED' THEN '998' END, r.last_error,
	       37, coalesce(r.succeeded_at, r.failed_at, r.updated_at),
	       CASE WHEN r.status = 'PENDING' THEN r.next_retry_at END
	FROM forward_records r
	WHERE r.attempt_count > 0
	  AND (r.status = 'FAILED' OR (r.status = 'PENDING' AND r.kafka_offset % 20 IN (10, 11))
	       OR (r.status = 'SUCCESS' AND NOT (r.kafka_offset % 20 = 9 AND (r.kafka_offset / 20) % 3 < 2)))
	ORDER BY r.id`,

	// Retention removed the newest delivered rows (their logs went with
	// them), and inserts that rolled back used ids.
	`DELETE FROM forward_records WHERE id IN (
	    SELECT id FROM forward_records WHERE status = 'SUCCESS' ORDER BY id DESC LIMIT 3)`,
	`SELECT nextval(pg_get_serial_sequence('forward_records', 'id')), nextval(pg_get_serial_sequence('forward_retry_logs', 'id'))
	FROM generate_series(1, 5)`,
	`ANALYZE forward_records, forward_retry_logs`,
}

// TestUpgradeToSchema5 upgrades a schema-4 database holding rows in every
// state a schema-4 binary left them (schema4Seed) with the embedded
// migrations, as `forwarder outbox migrate` does, and checks that nothing
// was lost or changed: every row reads the same through the view
// forward_records (the columns schema 5 keeps for a delivered message:
// docs/deployment.md, "Upgrading to schema 5"), the undelivered ones are
// the delivery rows with the same values, every attempt log is there with
// its id and values, a delivered row whose logs were purged still says how
// it was delivered, new ids continue after every id schema 4 handed out,
// and the upgraded outbox delivers: the ordering heads, held and blocked
// rows, the dead-letter claims and the leases work as they did. It reports
// how long the upgrade took, and the plan's estimate beside it.
func TestUpgradeToSchema5(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := defaultUpgradeRows
	if v := os.Getenv(upgradeRowsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 100 {
			t.Fatalf("%s=%q: want a number of rows, at least 100", upgradeRowsEnv, v)
		}
	}
	dsn := pgtest.NewEmptyDB(t)
	pool := openPool(t, dsn)
	ms := mustMigrations(t)
	if ms[3].Version != 4 || ms[4].Version != 5 {
		t.Fatalf("the embedded migrations are %v, want 0001-0004 then 0005", ms)
	}
	migrateTo(t, pool, ms[:4])

	seeded := time.Now()
	for i, stmt := range schema4Seed {
		var args []any
		if strings.Contains(stmt, "$1") {
			args = append(args, n)
		}
		if _, err := pool.Exec(ctx, stmt, args...); err != nil {
			t.Fatalf("seeding schema 4, statement %d: %v", i+1, err)
		}
	}
	// What schema 4 held, to compare with: the rows, the logs and how far
	// the id sequences went.
	exec(t, pool, `CREATE TABLE v4_records AS SELECT * FROM forward_records`)
	exec(t, pool, `CREATE TABLE v4_logs AS SELECT * FROM forward_retry_logs`)
	exec(t, pool, `ALTER TABLE v4_records ADD PRIMARY KEY (id)`)
	exec(t, pool, `ALTER TABLE v4_logs ADD PRIMARY KEY (id)`)
	exec(t, pool, `CREATE INDEX ON v4_logs (record_id)`)
	exec(t, pool, `ANALYZE v4_records, v4_logs`)
	var v4Rows, v4Logs, v4LastRecordID, v4LastLogID int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM v4_records), (SELECT count(*) FROM v4_logs),
			(SELECT last_value FROM forward_records_id_seq), (SELECT last_value FROM forward_retry_logs_id_seq)`).
		Scan(&v4Rows, &v4Logs, &v4LastRecordID, &v4LastLogID); err != nil {
		t.Fatal(err)
	}
	t.Logf("schema 4: %d rows and %d attempt logs made in %s", v4Rows, v4Logs, time.Since(seeded).Round(time.Millisecond))

	plans, err := outboxdb.PlanMigrations(ctx, pool, ms[4:5])
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) != 1 || len(plans[0].Copies) != 2 {
		t.Fatalf("plan %+v, want 0005 copying forward_records and forward_retry_logs", plans)
	}
	for _, line := range plans[0].Lines() {
		t.Logf("plan: %s", line)
	}

	started := time.Now()
	res := migrateTo(t, pool, ms[:5], outboxdb.MigrateOptions{NoLockTimeout: true})
	took := time.Since(started)
	if res.From != 4 || res.To != 5 {
		t.Fatalf("migrated from %d to %d, want 4 to 5", res.From, res.To)
	}
	t.Logf("upgraded %d rows and %d attempt logs from schema 4 to 5 in %s (%.0f rows/s); the plan expected %s",
		v4Rows, v4Logs, took.Round(time.Millisecond), float64(v4Rows)/took.Seconds(), plans[0].Estimate)

	// What schema 5 holds, read once through the view and from the
	// attempt log.
	read := time.Now()
	// Without JIT: until autovacuum has analyzed the new partitions, the
	// planner overestimates a read of the whole view and JIT-compiles it
	// for longer than the read takes.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE v5_records AS SELECT * FROM forward_records`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("read the %d rows of the view forward_records in %s", v4Rows, time.Since(read).Round(time.Millisecond))
	exec(t, pool, `CREATE TABLE v5_logs AS SELECT * FROM forward_retry_logs`)
	exec(t, pool, `ALTER TABLE v5_records ADD PRIMARY KEY (id)`)
	exec(t, pool, `CREATE INDEX ON v5_logs (id)`)
	exec(t, pool, `ANALYZE v5_records, v5_logs`)
	// The migrations after 5 are online, applied by the first instance that
	// starts: the code under test below is the current one.
	if res := migrateTo(t, pool, ms); res.To != outboxdb.LatestVersion() {
		t.Fatalf("migrated on to %d, want %d", res.To, outboxdb.LatestVersion())
	}

	// mismatches runs a query returning "what differs" lines and fails with
	// the first few.
	mismatches := func(t *testing.T, what, sql string) {
		t.Helper()
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(lines) > 0 {
			t.Errorf("%s: %d differ, the first:\n  %s", what, len(lines), strings.Join(lines[:min(len(lines), 5)], "\n  "))
		}
	}

	t.Run("EveryRowReadsTheSameThroughTheView", func(t *testing.T) {
		var got int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records`).Scan(&got); err != nil || got != v4Rows {
			t.Fatalf("forward_records shows %d rows (%v), schema 4 held %d", got, err, v4Rows)
		}
		// The columns every message keeps.
		mismatches(t, "messages", `SELECT format('id %s: %s <> %s', o.id, row(o.message_key, o.api_type, o.kafka_topic, o.kafka_partition,
				o.kafka_offset, o.kafka_key, md5(o.payload), o.status, o.created_at, o.plate_no, o.park_code, o.berth_code, o.device_id),
				row(n.message_key, n.api_type, n.kafka_topic, n.kafka_partition, n.kafka_offset, n.kafka_key, md5(n.payload), n.status,
				n.created_at, n.plate_no, n.park_code, n.berth_code, n.device_id))
			FROM v4_records o LEFT JOIN v5_records n ON n.id = o.id
			WHERE row(o.message_key, o.api_type, o.kafka_topic, o.kafka_partition, o.kafka_offset, o.kafka_key, o.payload,
				o.status, o.created_at, o.plate_no, o.park_code, o.berth_code, o.device_id)
			IS DISTINCT FROM row(n.message_key, n.api_type, n.kafka_topic, n.kafka_partition, n.kafka_offset, n.kafka_key,
				n.payload, n.status, n.created_at, n.plate_no, n.park_code, n.berth_code, n.device_id)
			ORDER BY o.id`)
		// An undelivered row keeps its whole delivery state.
		mismatches(t, "undelivered rows", `SELECT format('id %s: %s <> %s', o.id, row(o.attempt_count, o.next_retry_at, o.last_http_status,
				o.last_error, o.updated_at, o.succeeded_at, o.claim_token, o.claimed_by, o.claimed_at, o.dead_lettered_at,
				o.dead_letter_token, o.dead_letter_lease_until, o.ordering_key, o.order_held, o.order_blocked, o.failure_class,
				o.failed_at, o.requeue_rounds, o.lease_returns),
				row(n.attempt_count, n.next_retry_at, n.last_http_status, n.last_error, n.updated_at, n.succeeded_at, n.claim_token,
				n.claimed_by, n.claimed_at, n.dead_lettered_at, n.dead_letter_token, n.dead_letter_lease_until, n.ordering_key,
				n.order_held, n.order_blocked, n.failure_class, n.failed_at, n.requeue_rounds, n.lease_returns))
			FROM v4_records o JOIN v5_records n ON n.id = o.id
			WHERE o.status <> 'SUCCESS'
			  AND row(o.attempt_count, o.next_retry_at, o.last_http_status, o.last_error, o.updated_at, o.succeeded_at,
				o.claim_token, o.claimed_by, o.claimed_at, o.dead_lettered_at, o.dead_letter_token, o.dead_letter_lease_until,
				o.ordering_key, o.order_held, o.order_blocked, o.failure_class, o.failed_at, o.requeue_rounds, o.lease_returns)
			  IS DISTINCT FROM row(n.attempt_count, n.next_retry_at, n.last_http_status, n.last_error, n.updated_at,
				n.succeeded_at, n.claim_token, n.claimed_by, n.claimed_at, n.dead_lettered_at, n.dead_letter_token,
				n.dead_letter_lease_until, n.ordering_key, n.order_held, n.order_blocked, n.failure_class, n.failed_at,
				n.requeue_rounds, n.lease_returns)
			ORDER BY o.id`)
		// A delivered row: how many attempts, when, with which HTTP status,
		// by which instance. The rest of its schema-4 state (the finished
		// claim, an ordering key, compensation rounds) is not kept for a
		// delivered message in schema 5; the view shows it empty.
		mismatches(t, "delivered rows", `SELECT format('id %s: %s <> %s', o.id,
				row(o.attempt_count, o.last_http_status, o.succeeded_at, o.updated_at, o.claimed_by),
				row(n.attempt_count, n.last_http_status, n.succeeded_at, n.updated_at, n.claimed_by, n.next_retry_at, n.last_error,
				n.claim_token, n.claimed_at, n.ordering_key, n.order_held, n.order_blocked, n.failure_class, n.failed_at,
				n.requeue_rounds, n.lease_returns, n.dead_lettered_at))
			FROM v4_records o JOIN v5_records n ON n.id = o.id
			WHERE o.status = 'SUCCESS'
			  AND (row(o.attempt_count, o.last_http_status, o.succeeded_at, o.updated_at, o.claimed_by)
			       IS DISTINCT FROM row(n.attempt_count, n.last_http_status, n.succeeded_at, n.updated_at, n.claimed_by)
			    OR row(n.next_retry_at, n.last_error, n.claim_token, n.claimed_at, n.ordering_key, n.failure_class, n.failed_at,
			           n.dead_lettered_at, n.dead_letter_token, n.dead_letter_lease_until) IS DISTINCT FROM row(NULL::timestamptz,
			           NULL::text, NULL::uuid, NULL::timestamptz, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
			           NULL::uuid, NULL::timestamptz)
			    OR (n.order_held, n.order_blocked, n.requeue_rounds, n.lease_returns) <> (false, false, 0, 0))
			ORDER BY o.id`)
	})

	t.Run("TheUndeliveredRowsAreTheDeliveryState", func(t *testing.T) {
		var v4Undelivered, deliveries, wrongSize int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM v4_records WHERE status <> 'SUCCESS'),
				(SELECT count(*) FROM forward_deliveries),
				(SELECT count(*) FROM forward_deliveries d JOIN v4_records o ON o.id = d.id
				 WHERE d.payload_size <> octet_length(o.payload) OR d.created_at <> o.created_at
				    OR d.message_key <> o.message_key OR d.status <> o.status)`).
			Scan(&v4Undelivered, &deliveries, &wrongSize); err != nil {
			t.Fatal(err)
		}
		if deliveries != v4Undelivered || wrongSize != 0 {
			t.Errorf("%d delivery rows (%d with another size, time, key or status), want the %d undelivered rows of schema 4",
				deliveries, wrongSize, v4Undelivered)
		}
	})

	t.Run("EveryAttemptLogIsKept", func(t *testing.T) {
		// Ids are unique across the partitions (the primary key includes
		// the partition key, so only the copy can keep them so).
		mismatches(t, "log ids", `SELECT format('log id %s: %s logs', id, count(*))
			FROM v5_logs GROUP BY id HAVING count(*) > 1 ORDER BY id`)
		mismatches(t, "attempt logs", `SELECT format('log %s: %s <> %s', o.id, row(o.record_id, o.attempt_number, o.result_status,
				o.http_status, o.platform_errcode, o.error_message, o.duration_ms, o.attempted_at, o.next_retry_at, r.created_at),
				row(n.record_id, n.attempt_number, n.result_status, n.http_status, n.platform_errcode, n.error_message, n.duration_ms,
				n.attempted_at, n.next_retry_at, n.record_created_at))
			FROM v4_logs o
			JOIN v4_records r ON r.id = o.record_id
			LEFT JOIN v5_logs n ON n.id = o.id
			WHERE row(o.record_id, o.attempt_number, o.result_status, o.http_status, o.platform_errcode, o.error_message,
				o.duration_ms, o.attempted_at, o.next_retry_at, r.created_at)
			IS DISTINCT FROM row(n.record_id, n.attempt_number, n.result_status, n.http_status, n.platform_errcode,
				n.error_message, n.duration_ms, n.attempted_at, n.next_retry_at, n.record_created_at)
			ORDER BY o.id`)
		// The instance is known for the attempt that delivered a row: the
		// last SUCCESS of a SUCCESS row. Schema 4 did not record it for the
		// others.
		mismatches(t, "attempted_by", `SELECT format('log %s of row %s (%s): attempted_by %s, want %s', n.id, n.record_id,
				n.result_status, n.attempted_by, want.by)
			FROM v5_logs n
			JOIN v4_logs o ON o.id = n.id
			CROSS JOIN LATERAL (
			    SELECT CASE WHEN r.status = 'SUCCESS' AND n.id = (SELECT max(l.id) FROM v4_logs l
			                WHERE l.record_id = r.id AND l.result_status = 'SUCCESS') THEN r.claimed_by END AS by
			    FROM v4_records r WHERE r.id = n.record_id) AS want
			WHERE n.attempted_by IS DISTINCT FROM want.by
			ORDER BY n.id`)
		// A delivered row without a SUCCESS log (purged) got one, so that
		// the view still says when, how and by whom it was delivered; no
		// other log was added.
		var added, purged, wrong int64
		if err := pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM v5_logs n WHERE NOT EXISTS (SELECT 1 FROM v4_logs o WHERE o.id = n.id)),
				(SELECT count(*) FROM v4_records r WHERE r.status = 'SUCCESS'
				   AND NOT EXISTS (SELECT 1 FROM v4_logs l WHERE l.record_id = r.id AND l.result_status = 'SUCCESS')),
				(SELECT count(*) FROM v5_logs n JOIN v4_records r ON r.id = n.record_id
				 WHERE NOT EXISTS (SELECT 1 FROM v4_logs o WHERE o.id = n.id)
				   AND row(n.result_status, n.attempt_number, n.http_status, n.attempted_at, n.attempted_by, n.record_created_at)
				       IS DISTINCT FROM row('SUCCESS', r.attempt_count, r.last_http_status, r.succeeded_at, r.claimed_by, r.created_at))`).
			Scan(&added, &purged, &wrong); err != nil {
			t.Fatal(err)
		}
		if purged == 0 || added != purged || wrong != 0 {
			t.Errorf("%d logs added for %d delivered rows whose SUCCESS log was purged, %d of them wrong; want one each, right",
				added, purged, wrong)
		}
	})

	t.Run("NewIdsFollowEveryIdSchema4HandedOut", func(t *testing.T) {
		c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("after-upgrade", 1)})
		if err != nil || c.Pending != 1 {
			t.Fatalf("inserting after the upgrade: %+v, %v", c, err)
		}
		var id int64
		if err := pool.QueryRow(ctx, `SELECT id FROM forward_messages WHERE message_key = 'after-upgrade'`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id <= v4LastRecordID {
			t.Errorf("a new message got id %d, schema 4 had handed out ids up to %d", id, v4LastRecordID)
		}
		var logID int64
		if err := pool.QueryRow(ctx, `INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status)
			SELECT id, created_at, 0, 'REQUEUED' FROM forward_messages WHERE id = $1 RETURNING id`, id).Scan(&logID); err != nil {
			t.Fatal(err)
		}
		if logID <= v4LastLogID {
			t.Errorf("a new attempt log got id %d, schema 4 had handed out ids up to %d", logID, v4LastLogID)
		}
		// The sequences are named as on a database created at schema 5.
		var logSeq string
		if err := pool.QueryRow(ctx, `SELECT pg_get_serial_sequence('forward_retry_logs', 'id')`).Scan(&logSeq); err != nil ||
			logSeq != "public.forward_retry_logs_id_seq" {
			t.Errorf("the attempt log's id sequence is %q (%v), want public.forward_retry_logs_id_seq", logSeq, err)
		}
	})

	t.Run("TheUpgradedOutboxDelivers", func(t *testing.T) {
		// A redelivered message of schema 4 is still a duplicate,
		// delivered or not.
		c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("k-1", 1), pendingRec("k-10", 10)})
		if err != nil || c != (outboxdb.InsertCounts{Existing: 2}) {
			t.Fatalf("redelivering k-1 (delivered) and k-10 (pending): inserted %+v, %v; want neither", c, err)
		}
		var delivered, pending string
		if err := pool.QueryRow(ctx, `SELECT (SELECT status FROM forward_records WHERE message_key = 'k-1'),
				(SELECT status FROM forward_records WHERE message_key = 'k-10')`).Scan(&delivered, &pending); err != nil ||
			delivered != string(outboxdb.StatusSuccess) || pending != string(outboxdb.StatusPending) {
			t.Fatalf("after redelivering k-1 and k-10: %s and %s (%v); want them as they were, SUCCESS and PENDING", delivered, pending, err)
		}
		// The head of an ordering key, delivered, releases the row held
		// behind it; the row held behind a blocking FAILED row stays held.
		head, held := int64(15), int64(16)
		var headID, heldID, blockedHeldID int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT id FROM forward_records WHERE message_key = 'k-' || $1::bigint),
				(SELECT id FROM forward_records WHERE message_key = 'k-' || $2::bigint),
				(SELECT id FROM forward_records WHERE message_key = 'k-18')`, head, held).
			Scan(&headID, &heldID, &blockedHeldID); err != nil {
			t.Fatal(err)
		}
		exec(t, pool, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 year' WHERE id = $1`, headID)
		claimed, err := outboxdb.Claim(ctx, pool, 1, time.Minute, "after-upgrade")
		if err != nil || len(claimed) != 1 || claimed[0].ID != headID {
			t.Fatalf("claimed %+v (%v), want the head %d", claimed, err, headID)
		}
		if _, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{ID: claimed[0].ID, ClaimToken: claimed[0].ClaimToken,
			Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}},
			outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
		var headStatus string
		var heldNow, blockedHeldNow bool
		if err := pool.QueryRow(ctx, `SELECT (SELECT status FROM forward_records WHERE id = $1),
				(SELECT order_held FROM forward_records WHERE id = $2), (SELECT order_held FROM forward_records WHERE id = $3)`,
			headID, heldID, blockedHeldID).Scan(&headStatus, &heldNow, &blockedHeldNow); err != nil {
			t.Fatal(err)
		}
		if headStatus != "SUCCESS" || heldNow || !blockedHeldNow {
			t.Errorf("after delivering the head: head %s, the row behind it held %v, the row behind a blocking FAILED row held %v; want SUCCESS, false, true",
				headStatus, heldNow, blockedHeldNow)
		}
		// The dead-letter topic takes the FAILED rows neither published
		// nor leased, oldest first.
		var wantDead int64
		if err := pool.QueryRow(ctx, `SELECT min(id) FROM v4_records WHERE status = 'FAILED' AND dead_lettered_at IS NULL
			AND (dead_letter_lease_until IS NULL OR dead_letter_lease_until <= now())`).Scan(&wantDead); err != nil {
			t.Fatal(err)
		}
		dead, err := outboxdb.ClaimDeadLetters(ctx, pool, 1, time.Minute)
		if err != nil || len(dead) != 1 || dead[0].ID != wantDead {
			t.Errorf("dead-letter claim: %+v (%v), want row %d", dead, err, wantDead)
		}
	})

	t.Run("EveryUndeliveredRowIsThenDelivered", func(t *testing.T) {
		// The retries and leases of schema 4 fall due now (the instances
		// that held the leases are gone), and a dispatcher claims and
		// delivers until nothing is due: every PENDING and IN_PROGRESS row
		// of schema 4 ends SUCCESS, the rows held behind an ordering head
		// included, except those held behind a FAILED row blocking their
		// key, which stay held.
		exec(t, pool, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second'
			WHERE status IN ('PENDING', 'IN_PROGRESS')`)
		delivered := 0
		for {
			claimed, err := outboxdb.Claim(ctx, pool, 2000, time.Minute, "after-upgrade")
			if err != nil {
				t.Fatal(err)
			}
			if len(claimed) == 0 {
				break
			}
			results := make([]outboxdb.Result, len(claimed))
			for i, r := range claimed {
				results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
			}
			if _, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{}); err != nil {
				t.Fatal(err)
			}
			delivered += len(claimed)
		}
		var undelivered, blockedHeld, notBlocked int64
		if err := pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE n.status <> 'SUCCESS'),
				count(*) FILTER (WHERE n.status = 'PENDING' AND n.order_held AND EXISTS (SELECT 1 FROM forward_deliveries b
				    WHERE b.ordering_key = n.ordering_key AND b.order_blocked)),
				count(*) FILTER (WHERE n.status <> 'SUCCESS' AND NOT (n.order_held AND EXISTS (SELECT 1 FROM forward_deliveries b
				    WHERE b.ordering_key = n.ordering_key AND b.order_blocked)))
			FROM v4_records o JOIN forward_records n ON n.id = o.id
			WHERE o.status IN ('PENDING', 'IN_PROGRESS')`).Scan(&undelivered, &blockedHeld, &notBlocked); err != nil {
			t.Fatal(err)
		}
		if blockedHeld == 0 || notBlocked != 0 {
			t.Errorf("after delivering %d rows, %d of the PENDING and IN_PROGRESS rows of schema 4 are not SUCCESS: %d held behind a blocking FAILED row (want some), %d others (want none)",
				delivered, undelivered, blockedHeld, notBlocked)
		}
		t.Logf("delivered %d rows after the upgrade; %d stay held behind a blocking FAILED row", delivered, blockedHeld)
	})
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", strings.SplitN(strings.TrimSpace(sql), "\n", 2)[0], err)
	}
}
