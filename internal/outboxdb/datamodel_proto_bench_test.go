package outboxdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// BenchmarkDataModelPrototype measures, on one durable PostgreSQL (fsync and
// synchronous_commit on) and in the same run, one delivered message's
// lifecycle on the backlog path (inserted PENDING, claimed, result SUCCESS),
// in batches of 300, with today's wide row (schema 4: forward_records) and
// with the prototype of the split (docs/architecture.md, "Data model"):
// an immutable message in a daily partition, a narrow delivery state the
// claim and the result write change, deleted once delivered, and a
// partitioned attempt log. The prototype's insert probes every partition of
// a week of earlier messages for the key (the dedupe across partitions) and
// runs the race backstop; the claim joins the message for its payload.
//
// It reports rows/s (whole lifecycles per second on one connection: the
// database's time per message), WAL bytes per message, and the share of
// updates that stayed HOT.
//
//	go test ./internal/outboxdb -run '^$' -bench BenchmarkDataModelPrototype -benchtime 20x -count 3
func BenchmarkDataModelPrototype(b *testing.B) {
	const batch = 300
	c := pgtest.StartDurableCluster(b)
	ctx := context.Background()

	today := func(b *testing.B) (*pgxpool.Pool, func(i int) error) {
		pool := openBenchPool(b, pgtest.NewDBOn(b, c))
		if err := outboxdb.EnsureSchema(ctx, pool); err != nil {
			b.Fatal(err)
		}
		recs := make([]outboxdb.NewRecord, batch)
		results := make([]outboxdb.Result, 0, batch)
		claim := outboxdb.ClaimParams{Limit: batch, Lease: time.Minute, Claimer: "bench", MaxAttempts: 5}
		return pool, func(i int) error {
			for j := range recs {
				recs[j] = protoRecord(i*batch + j)
			}
			if _, err := outboxdb.InsertBatchCount(ctx, pool, recs); err != nil {
				return err
			}
			res, err := outboxdb.ClaimDue(ctx, pool, claim)
			if err != nil {
				return err
			}
			results = results[:0]
			for _, r := range res.Claimed {
				results = append(results, outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken,
					Status: outboxdb.StatusSuccess, Sent: true, Duration: time.Millisecond, HTTPStatus: 200})
			}
			recorded, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{})
			if err != nil {
				return err
			}
			if len(recorded) != batch {
				return fmt.Errorf("recorded %d, want %d", len(recorded), batch)
			}
			return nil
		}
	}

	split := func(b *testing.B) (*pgxpool.Pool, func(i int) error) {
		pool := openBenchPool(b, pgtest.NewDBOn(b, c))
		if _, err := pool.Exec(ctx, protoSchemaSQL); err != nil {
			b.Fatal(err)
		}
		// A week of earlier messages, 20 000 a day, for the insert's
		// probes to walk.
		if _, err := pool.Exec(ctx, protoHistorySQL); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
			b.Fatal(err)
		}
		keys := make([]string, batch)
		cols := protoColumns{}
		b.Cleanup(func() {
			if protoPhase[0] > 0 {
				b.Logf("split: insert %v, claim %v, result %v per message", protoPhase[0]/time.Duration(protoN*batch),
					protoPhase[1]/time.Duration(protoN*batch), protoPhase[2]/time.Duration(protoN*batch))
			}
		})
		return pool, func(i int) error {
			protoN++
			t0 := time.Now()
			cols.reset(batch)
			for j := range batch {
				r := protoRecord(i*batch + j)
				keys[j] = r.MessageKey
				cols.add(r)
			}
			// The insert: the batch, then the race backstop, in one
			// pipeline (one transaction, one round trip).
			bt := &pgx.Batch{}
			bt.Queue(protoInsertSQL, cols.args()...)
			bt.Queue(protoBackstopSQL, keys)
			br := pool.SendBatch(ctx, bt)
			var inserted int
			if err := br.QueryRow().Scan(&inserted); err != nil {
				br.Close()
				return fmt.Errorf("insert: %w", err)
			}
			var dups int
			if err := br.QueryRow().Scan(&dups); err != nil {
				br.Close()
				return fmt.Errorf("backstop: %w", err)
			}
			if err := br.Close(); err != nil {
				return err
			}
			if inserted != batch || dups != 0 {
				return fmt.Errorf("inserted %d (%d duplicates), want %d", inserted, dups, batch)
			}
			t1 := time.Now()
			protoPhase[0] += t1.Sub(t0)
			rows, err := pool.Query(ctx, protoClaimSQL, batch, time.Minute.Milliseconds(), "bench")
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			var (
				ids     []int64
				tokens  []string
				payload int
			)
			for rows.Next() {
				var (
					id      int64
					created time.Time
					attempt int
					token   string
					lease   time.Time
					key     string
					p       []byte
				)
				if err := rows.Scan(&id, &created, &attempt, &token, &lease, &key, &p); err != nil {
					rows.Close()
					return err
				}
				ids, tokens, payload = append(ids, id), append(tokens, token), payload+len(p)
			}
			if err := rows.Err(); err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			if len(ids) != batch || payload == 0 {
				return fmt.Errorf("claimed %d rows, want %d", len(ids), batch)
			}
			t2 := time.Now()
			protoPhase[1] += t2.Sub(t1)
			statuses := make([]string, len(ids))
			https := make([]int32, len(ids))
			for j := range statuses {
				statuses[j], https[j] = "SUCCESS", 200
			}
			var recorded int
			if err := pool.QueryRow(ctx, protoResultSQL, ids, tokens, statuses, https, "bench").Scan(&recorded); err != nil {
				return fmt.Errorf("result: %w", err)
			}
			if recorded != batch {
				return fmt.Errorf("recorded %d, want %d", recorded, batch)
			}
			protoPhase[2] += time.Since(t2)
			return nil
		}
	}

	for _, model := range []struct {
		name  string
		setup func(*testing.B) (*pgxpool.Pool, func(int) error)
		// tables whose HOT updates are reported
		tables string
	}{
		{"schema4-wide-row", today, "forward_records"},
		{"schema5-split", split, "forward_deliveries"},
	} {
		b.Run(model.name, func(b *testing.B) {
			pool, cycle := model.setup(b)
			// One warm-up batch so that plans are prepared and caches hot.
			if err := cycle(1_000_000); err != nil {
				b.Fatal(err)
			}
			lsn0 := walLSN(b, pool)
			upd0, hot0 := hotUpdates(b, pool, model.tables)
			b.ResetTimer()
			for i := range b.N {
				if err := cycle(i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			msgs := float64(b.N * batch)
			b.ReportMetric(msgs/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(walLSN(b, pool)-lsn0)/msgs, "WAL-B/msg")
			upd, hot := hotUpdates(b, pool, model.tables)
			if upd > upd0 {
				b.ReportMetric(100*float64(hot-hot0)/float64(upd-upd0), "%HOT")
			}
		})
	}
}

var (
	protoPhase [3]time.Duration
	protoN     int
)

func openBenchPool(b *testing.B, dsn string) *pgxpool.Pool {
	b.Helper()
	pool, err := outboxdb.Open(context.Background(), dsn, outboxdb.PoolConfig{MaxConns: 2, NoSeqScan: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func walLSN(b *testing.B, pool *pgxpool.Pool) int64 {
	b.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// hotUpdates reads the statistics of table: updates and HOT updates. They
// are sent at the end of each transaction, so it waits for them.
func hotUpdates(b *testing.B, pool *pgxpool.Pool, table string) (upd, hot int64) {
	b.Helper()
	ctx := context.Background()
	time.Sleep(600 * time.Millisecond) // stats are flushed at most every 500 ms
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)
		FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&upd, &hot); err != nil {
		b.Fatal(err)
	}
	return upd, hot
}

func protoRecord(n int) outboxdb.NewRecord {
	r := lifecycleRecord(n)
	r.MessageKey = fmt.Sprintf("proto-%08d-%s", n, strings.Repeat("k", 20))
	r.PlateNo, r.ParkCode, r.BerthCode, r.DeviceID = fmt.Sprintf("粤B%05d", n%50000), fmt.Sprintf("P%03d", n%200), fmt.Sprintf("B%04d", n%5000), fmt.Sprintf("dev-%d", n%1000)
	r.OrderingKey = r.ParkCode + "/" + r.BerthCode + fmt.Sprint(n)
	return r
}

// protoColumns lays a batch out as the prototype insert's arrays.
type protoColumns struct {
	key, api, topic, plate, park, berth, device, okey []string
	part                                              []int32
	off                                               []int64
	kkey, payload                                     [][]byte
}

func (c *protoColumns) reset(n int) {
	*c = protoColumns{}
}

func (c *protoColumns) add(r outboxdb.NewRecord) {
	c.key = append(c.key, r.MessageKey)
	c.api = append(c.api, r.APIType)
	c.topic = append(c.topic, r.KafkaTopic)
	c.part = append(c.part, r.KafkaPartition)
	c.off = append(c.off, r.KafkaOffset)
	c.kkey = append(c.kkey, r.KafkaKey)
	c.payload = append(c.payload, r.Payload)
	c.plate = append(c.plate, r.PlateNo)
	c.park = append(c.park, r.ParkCode)
	c.berth = append(c.berth, r.BerthCode)
	c.device = append(c.device, r.DeviceID)
	c.okey = append(c.okey, r.OrderingKey)
}

func (c *protoColumns) args() []any {
	return []any{c.key, c.api, c.topic, c.part, c.off, c.kkey, c.payload, c.plate, c.park, c.berth, c.device, c.okey}
}

// The prototype's schema: the immutable message, partitioned by day, with
// the lookup indexes; the narrow delivery state; the partitioned attempt
// log. Partitions from a week ago to tomorrow.
const protoSchemaSQL = `
DROP TABLE forward_retry_logs, forward_records;
CREATE SEQUENCE forward_messages_id_seq;
CREATE TABLE forward_messages (
    id              bigint      NOT NULL DEFAULT nextval('forward_messages_id_seq'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    message_key     text        NOT NULL,
    api_type        text        NOT NULL,
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    kafka_key       bytea,
    payload         bytea       NOT NULL,
    plate_no        text,
    park_code       text,
    berth_code      text,
    device_id       text,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX forward_messages_key_idx    ON forward_messages (message_key);
CREATE INDEX forward_messages_plate_idx  ON forward_messages (plate_no, id)   WHERE plate_no IS NOT NULL;
CREATE INDEX forward_messages_park_idx   ON forward_messages (park_code, berth_code, id) WHERE park_code IS NOT NULL;
CREATE INDEX forward_messages_park_id_idx ON forward_messages (park_code, id) WHERE park_code IS NOT NULL;
CREATE INDEX forward_messages_berth_idx  ON forward_messages (berth_code, id) WHERE berth_code IS NOT NULL;
CREATE INDEX forward_messages_device_idx ON forward_messages (device_id, id)  WHERE device_id IS NOT NULL;

CREATE TABLE forward_deliveries (
    id               bigint      PRIMARY KEY,
    created_at       timestamptz NOT NULL,
    message_key      text        NOT NULL,
    status           text        NOT NULL,
    attempt_count    integer     NOT NULL DEFAULT 0,
    next_retry_at    timestamptz,
    payload_size     integer     NOT NULL,
    claim_token      uuid,
    claimed_by       text,
    last_http_status integer,
    last_error       text,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    failure_class    text,
    failed_at        timestamptz,
    requeue_rounds   smallint    NOT NULL DEFAULT 0,
    lease_returns    smallint    NOT NULL DEFAULT 0,
    ordering_key     text,
    order_held       boolean     NOT NULL DEFAULT false,
    order_blocked    boolean     NOT NULL DEFAULT false,
    CONSTRAINT forward_deliveries_message_key_key UNIQUE (message_key)
) WITH (fillfactor = 80);
CREATE INDEX forward_deliveries_due_idx ON forward_deliveries (next_retry_at, id)
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;
CREATE UNIQUE INDEX forward_deliveries_order_head_key ON forward_deliveries (ordering_key)
    WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;
CREATE INDEX forward_deliveries_order_idx ON forward_deliveries (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND (status IN ('PENDING', 'IN_PROGRESS') OR order_blocked);
CREATE INDEX forward_deliveries_failed_idx ON forward_deliveries (failure_class, failed_at) WHERE status = 'FAILED';

CREATE TABLE forward_retry_logs (
    id                bigint GENERATED ALWAYS AS IDENTITY,
    record_id         bigint      NOT NULL,
    record_created_at timestamptz NOT NULL,
    attempt_number    integer     NOT NULL,
    result_status     text        NOT NULL,
    http_status       integer,
    platform_errcode  text,
    error_message     text,
    duration_ms       integer,
    attempted_at      timestamptz NOT NULL DEFAULT now(),
    next_retry_at     timestamptz,
    attempted_by      text,
    PRIMARY KEY (id, record_created_at)
) PARTITION BY RANGE (record_created_at);
CREATE INDEX forward_retry_logs_record_idx ON forward_retry_logs (record_id);
CREATE INDEX forward_retry_logs_errcode_idx ON forward_retry_logs (platform_errcode, record_id) WHERE platform_errcode IS NOT NULL;

DO $$
DECLARE d date;
BEGIN
    FOR d IN SELECT generate_series(current_date - 7, current_date + 1, interval '1 day')::date LOOP
        EXECUTE format('CREATE TABLE forward_messages_%s PARTITION OF forward_messages FOR VALUES FROM (%L) TO (%L)',
                       to_char(d, 'YYYYMMDD'), d, d + 1);
        EXECUTE format('CREATE TABLE forward_retry_logs_%s PARTITION OF forward_retry_logs FOR VALUES FROM (%L) TO (%L)',
                       to_char(d, 'YYYYMMDD'), d, d + 1);
    END LOOP;
END $$;
`

// protoHistorySQL fills the week before today with delivered messages.
const protoHistorySQL = `
INSERT INTO forward_messages (created_at, message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, plate_no, park_code, berth_code, device_id)
SELECT current_date - (g % 7 + 1) + interval '1 hour', 'old-' || g, 'VEHICLE_EVENT', 'device-vehicle-event', g % 3, g,
       convert_to(repeat('x', 330), 'UTF8'), '粤B' || (g % 50000), 'P' || (g % 200), 'B' || (g % 5000), 'dev-' || (g % 1000)
FROM generate_series(1, 140000) g;
`

// protoInsertSQL stores a batch: the records whose key no partition holds
// get an id, a delivery state (whose unique key serialises concurrent
// inserters of one message) and their message. No ordering holds here:
// every key is new.
const protoInsertSQL = `
WITH batch AS (
    SELECT u.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::bytea[], $7::bytea[],
                $8::text[], $9::text[], $10::text[], $11::text[], $12::text[]) WITH ORDINALITY
         AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload,
              plate_no, park_code, berth_code, device_id, ordering_key, n)
), fresh AS (
    SELECT b.*, nextval('forward_messages_id_seq') AS id
    FROM (SELECT * FROM batch ORDER BY n) AS b
    WHERE NOT EXISTS (SELECT 1 FROM forward_messages m WHERE m.message_key = b.message_key)
), states AS (
    INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size, ordering_key)
    SELECT id, now(), message_key, 'PENDING', now(), octet_length(payload), nullif(ordering_key, '')
    FROM fresh
    ORDER BY n
    ON CONFLICT (message_key) DO NOTHING
    RETURNING id
), messages AS (
    INSERT INTO forward_messages (id, created_at, message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
                                  kafka_key, payload, plate_no, park_code, berth_code, device_id)
    SELECT id, now(), message_key, api_type, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload,
           nullif(plate_no, ''), nullif(park_code, ''), nullif(berth_code, ''), nullif(device_id, '')
    FROM fresh
    WHERE id IN (SELECT id FROM states)
    ORDER BY n
    RETURNING id
)
SELECT count(*) FROM messages`

// protoBackstopSQL: the same keys stored twice in the partitions of the
// last day (a concurrent inserter's message that was delivered and lost
// its delivery state while this insert ran).
const protoBackstopSQL = `
SELECT count(*) FROM (
    SELECT message_key FROM forward_messages
    WHERE message_key = ANY ($1::text[]) AND created_at > now() - interval '1 day'
    GROUP BY message_key HAVING count(*) > 1) AS d`

const protoClaimSQL = `
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), locked AS (
    SELECT id
    FROM forward_deliveries
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held AND next_retry_at <= now()
    ORDER BY next_retry_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE forward_deliveries AS d
    SET status        = 'IN_PROGRESS',
        attempt_count = d.attempt_count + 1,
        next_retry_at = now() + $2::bigint * interval '1 millisecond',
        claim_token   = gen_random_uuid(),
        claimed_by    = $3::text,
        updated_at    = now()
    WHERE d.id = ANY (ARRAY(SELECT id FROM locked))
    RETURNING d.id, d.created_at, d.attempt_count, d.claim_token::text AS claim_token, d.next_retry_at
)
SELECT c.id, c.created_at, c.attempt_count, c.claim_token, c.next_retry_at, m.message_key, m.payload
FROM claimed c
JOIN forward_messages m ON m.id = c.id AND m.created_at = c.created_at
CROSS JOIN async
WHERE async.done = 'off'`

const protoResultSQL = `
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), result AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::integer[]) AS t(id, claim_token, status, http_status)
), delivered AS (
    DELETE FROM forward_deliveries AS d
    USING result
    WHERE d.id = result.id AND d.claim_token::text = result.claim_token
      AND (d.status = 'IN_PROGRESS') IS TRUE AND result.status = 'SUCCESS'
    RETURNING d.id, d.created_at, d.attempt_count
), logged AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status, duration_ms, attempted_by)
    SELECT delivered.id, delivered.created_at, delivered.attempt_count, 'SUCCESS', result.http_status, 1, $5::text
    FROM delivered JOIN result ON result.id = delivered.id
)
SELECT count(*) FROM delivered, async WHERE async.done = 'off'`
