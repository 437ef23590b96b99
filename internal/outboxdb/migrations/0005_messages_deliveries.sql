-- Schema 5: a message is written once, its delivery state is a narrow row
-- beside it, and old days are retired by dropping their partition
-- (docs/architecture.md, "Database: the data model").
--
--   forward_messages    immutable, partitioned by created_at
--   forward_deliveries  the state of each message not yet delivered
--   forward_retry_logs  the attempts, partitioned like the messages
--   forward_records     a view: the message as one row, as it always read
--
-- From schema 4 every row, its status, attempts and attempt log are copied;
-- the schema-4 tables are dropped at the end of the same transaction, so the
-- upgrade happens whole or not at all. `forwarder outbox migrate` says how
-- long it expects the copy to lock the tables before it starts
-- (docs/deployment.md, "Upgrading to schema 5").
--
-- copies: forward_records, forward_retry_logs

-- Partitions, one row each: the messages and attempts of [lower, upper).
-- The dispatcher creates them ahead and retires old ones; this table is how
-- it knows which exist without parsing partition bounds.
CREATE TABLE forward_partitions (
    lower        timestamptz PRIMARY KEY,
    upper        timestamptz NOT NULL,
    messages     text        NOT NULL,
    retry_logs   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT forward_partitions_range_check CHECK (upper > lower),
    CONSTRAINT forward_partitions_no_overlap EXCLUDE USING gist (tstzrange(lower, upper) WITH &&)
);

ALTER TABLE forward_records RENAME TO forward_records_v4;
ALTER TABLE forward_retry_logs RENAME TO forward_retry_logs_v4;
-- Their names are the new tables' (the schema-4 tables go at the end).
ALTER TABLE forward_retry_logs_v4 RENAME CONSTRAINT forward_retry_logs_pkey TO forward_retry_logs_v4_pkey;
ALTER INDEX forward_retry_logs_record_id_idx RENAME TO forward_retry_logs_v4_record_id_idx;
ALTER INDEX forward_retry_logs_errcode_idx RENAME TO forward_retry_logs_v4_errcode_idx;
-- Their identity sequences too, or the new attempt log's would be named
-- forward_retry_logs_id_seq1 on an upgraded database only.
ALTER SEQUENCE forward_records_id_seq RENAME TO forward_records_v4_id_seq;
ALTER SEQUENCE forward_retry_logs_id_seq RENAME TO forward_retry_logs_v4_id_seq;

CREATE SEQUENCE forward_messages_id_seq AS bigint;

-- The message as received, never updated. Lookup columns are copied from
-- the payload at ingest, for `outbox find` and the console.
CREATE TABLE forward_messages (
    id              bigint      NOT NULL DEFAULT nextval('forward_messages_id_seq'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    message_key     text        NOT NULL,
    api_type        text        NOT NULL,
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    -- Kafka keys and payloads are arbitrary bytes: bytea keeps them byte
    -- for byte, including bytes that are not valid UTF-8.
    kafka_key       bytea,
    payload         bytea       NOT NULL,
    plate_no        text,
    park_code       text,
    berth_code      text,
    device_id       text,
    CONSTRAINT forward_messages_pkey PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE forward_messages_id_seq OWNED BY forward_messages.id;

-- The dedupe probe of the insert and `outbox show <key>` (a key is unique
-- among the messages by the insert's protocol, not by this index: see
-- forward_deliveries_message_key_key).
CREATE INDEX forward_messages_key_idx ON forward_messages (message_key);
-- Lookups, newest first: by plate, by park and berth, by park, by berth, by
-- device (docs/operations.md, "Looking things up").
CREATE INDEX forward_messages_plate_idx   ON forward_messages (plate_no, id)   WHERE plate_no IS NOT NULL;
CREATE INDEX forward_messages_park_idx    ON forward_messages (park_code, berth_code, id) WHERE park_code IS NOT NULL;
CREATE INDEX forward_messages_park_id_idx ON forward_messages (park_code, id)  WHERE park_code IS NOT NULL;
CREATE INDEX forward_messages_berth_idx   ON forward_messages (berth_code, id) WHERE berth_code IS NOT NULL;
CREATE INDEX forward_messages_device_idx  ON forward_messages (device_id, id)  WHERE device_id IS NOT NULL;

-- The delivery state: one row per message not yet delivered (PENDING,
-- IN_PROGRESS) or FAILED. The result write that makes a message SUCCESS
-- deletes it, so this table holds the backlog and the failures only.
-- Claims, renewals, results, ordering and compensation change nothing else.
CREATE TABLE forward_deliveries (
    id                      bigint      PRIMARY KEY,
    -- The message's created_at: its partition.
    created_at              timestamptz NOT NULL,
    message_key             text        NOT NULL,
    status                  text        NOT NULL,
    attempt_count           integer     NOT NULL DEFAULT 0,
    -- When the row is next due: the retry time for PENDING, the lease
    -- deadline for IN_PROGRESS (an expired lease makes it due again), NULL
    -- once FAILED.
    next_retry_at           timestamptz,
    -- octet_length(payload), so that a claim bounds the bytes it takes
    -- without reading the messages.
    payload_size            integer     NOT NULL,
    -- Fencing: a result is written only by the holder of the current claim.
    claim_token             uuid,
    claimed_by              text,
    claimed_at              timestamptz,
    last_http_status        integer,
    last_error              text,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    -- Why a FAILED row failed: TRANSIENT (automatic compensation may
    -- requeue it), REJECTED (refused for good) or INVALID (bad input).
    failure_class           text,
    failed_at               timestamptz,
    requeue_rounds          integer     NOT NULL DEFAULT 0,
    lease_returns           integer     NOT NULL DEFAULT 0,
    -- Ordering (docs/architecture.md, "Ordering").
    ordering_key            text,
    order_held              boolean     NOT NULL DEFAULT false,
    order_blocked           boolean     NOT NULL DEFAULT false,
    -- The dead-letter topic's claim on a FAILED row, and when it was
    -- published (a requeue clears it).
    dead_lettered_at        timestamptz,
    dead_letter_token       uuid,
    dead_letter_lease_until timestamptz,

    -- Two inserters of one message at once meet here: every stored message
    -- has a delivery row until it is delivered (docs/architecture.md,
    -- "Dedupe across partitions").
    CONSTRAINT forward_deliveries_message_key_key UNIQUE (message_key),
    CONSTRAINT forward_deliveries_status_check CHECK (status IN ('PENDING', 'IN_PROGRESS', 'FAILED')),
    CONSTRAINT forward_deliveries_due_check
        CHECK ((status IN ('PENDING', 'IN_PROGRESS')) = (next_retry_at IS NOT NULL)),
    CONSTRAINT forward_deliveries_attempt_count_check CHECK (attempt_count >= 0),
    CONSTRAINT forward_deliveries_failure_class_check
        CHECK (failure_class IS NULL OR failure_class IN ('TRANSIENT', 'REJECTED', 'INVALID')),
    CONSTRAINT forward_deliveries_order_held_check
        CHECK (NOT order_held OR (status = 'PENDING' AND ordering_key IS NOT NULL)),
    CONSTRAINT forward_deliveries_order_blocked_check
        CHECK (NOT order_blocked OR (status = 'FAILED' AND ordering_key IS NOT NULL))
) WITH (fillfactor = 80);

-- The claim: due rows in due order; held rows are not in it.
CREATE INDEX forward_deliveries_due_idx ON forward_deliveries (next_retry_at, id)
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;
-- Counts by status (gauges, stats) and requeue filters.
CREATE INDEX forward_deliveries_status_idx ON forward_deliveries (status, updated_at);
-- At most one row per ordering key may be due or in flight: the head.
CREATE UNIQUE INDEX forward_deliveries_order_head_key ON forward_deliveries (ordering_key)
    WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;
-- The rows that hold a key: the head and the rows held behind it, in id
-- order, and a FAILED row blocking it.
CREATE INDEX forward_deliveries_order_idx ON forward_deliveries (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND (status IN ('PENDING', 'IN_PROGRESS') OR order_blocked);
CREATE INDEX forward_deliveries_order_held_idx ON forward_deliveries (id) WHERE order_held;
CREATE INDEX forward_deliveries_order_blocked_idx ON forward_deliveries (ordering_key) WHERE order_blocked;
-- Automatic compensation: FAILED rows that may be requeued, oldest failure first.
CREATE INDEX forward_deliveries_compensation_idx ON forward_deliveries (requeue_rounds, failed_at)
    WHERE status = 'FAILED' AND failure_class = 'TRANSIENT';
-- The dead-letter claim: FAILED rows not yet published, in id order.
CREATE INDEX forward_deliveries_dead_letter_idx ON forward_deliveries (id)
    WHERE status = 'FAILED' AND dead_lettered_at IS NULL;

-- One row per attempt (and per lease expiry, requeue or ordering release),
-- in the partition of its message, so that a day's attempts go with it.
CREATE TABLE forward_retry_logs (
    id                bigint      GENERATED BY DEFAULT AS IDENTITY,
    record_id         bigint      NOT NULL,
    -- The message's created_at: its partition.
    record_created_at timestamptz NOT NULL,
    attempt_number    integer     NOT NULL,
    -- The status the attempt left the message in (SUCCESS, FAILED,
    -- PENDING), or LEASE_EXPIRED, REQUEUED, ORDER_RELEASED.
    result_status     text        NOT NULL,
    http_status       integer,
    platform_errcode  text,
    error_message     text,
    duration_ms       integer,
    attempted_at      timestamptz NOT NULL DEFAULT now(),
    next_retry_at     timestamptz,
    -- The instance that made the attempt.
    attempted_by      text,
    CONSTRAINT forward_retry_logs_pkey PRIMARY KEY (id, record_created_at)
) PARTITION BY RANGE (record_created_at);
CREATE INDEX forward_retry_logs_record_id_idx ON forward_retry_logs (record_id, id);
-- Messages whose attempts got a platform errcode, newest first.
CREATE INDEX forward_retry_logs_errcode_idx ON forward_retry_logs (platform_errcode, record_id)
    WHERE platform_errcode IS NOT NULL;

-- Raised by insert_backstop.sql when a batch stored a message that another
-- transaction stored and delivered while the insert ran: the insert rolls
-- back and is run again.
CREATE FUNCTION forward_messages_stored_twice(key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'message key % was stored by another transaction while this insert ran', key
        USING ERRCODE = 'serialization_failure';
END
$$;

-- forward_partition_ensure creates the partitions of messages and attempts
-- that cover [p_from, p_to), p_width wide, aligned on midnight UTC, each as
-- a standalone table attached to its parent (ATTACH PARTITION takes a SHARE
-- UPDATE EXCLUSIVE lock: inserts and claims go on). Ranges already covered
-- are skipped, whatever their width. It returns the number of partitions
-- created. It takes a transaction lock of its own, so that instances calling
-- it at once create each partition once. SECURITY DEFINER: the service's
-- role needs no DDL rights to create partitions, only EXECUTE on this
-- (docs/deployment.md, "Roles and grants").
CREATE FUNCTION forward_partition_ensure(p_from timestamptz, p_to timestamptz, p_width interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    origin  constant timestamptz := timestamptz '2000-01-01 00:00:00+00';
    lo      timestamptz := date_bin(p_width, p_from, origin);
    hi      timestamptz;
    covered timestamptz;
    name    text;
    created integer := 0;
BEGIN
    IF p_width < interval '1 hour' OR p_width > interval '31 days' THEN
        RAISE EXCEPTION 'partition width % is not between 1 hour and 31 days', p_width;
    END IF;
    -- 'forwprtn'
    PERFORM pg_advisory_xact_lock(7381244171596756078);
    WHILE lo < p_to LOOP
        -- Step over a partition that covers lo (one of another width may
        -- end anywhere).
        SELECT p.upper INTO covered FROM forward_partitions p WHERE p.lower <= lo AND p.upper > lo;
        IF FOUND THEN
            lo := covered;
            CONTINUE;
        END IF;
        -- From lo to the end of its width, or to the next partition.
        hi := date_bin(p_width, lo, origin) + p_width;
        SELECT coalesce(min(p.lower), hi) INTO hi FROM forward_partitions p WHERE p.lower > lo AND p.lower < hi;
        name := to_char(lo AT TIME ZONE 'UTC', '"p"YYYYMMDD"t"HH24MI');
        EXECUTE format('CREATE TABLE %I (LIKE forward_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 100)',
                       'forward_messages_' || name);
        EXECUTE format('ALTER TABLE forward_messages ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       'forward_messages_' || name, lo, hi);
        EXECUTE format('CREATE TABLE %I (LIKE forward_retry_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       'forward_retry_logs_' || name);
        EXECUTE format('ALTER TABLE forward_retry_logs ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       'forward_retry_logs_' || name, lo, hi);
        INSERT INTO forward_partitions (lower, upper, messages, retry_logs)
        VALUES (lo, hi, 'forward_messages_' || name, 'forward_retry_logs_' || name);
        created := created + 1;
        lo := hi;
    END LOOP;
    RETURN created;
END
$$;
-- SECURITY DEFINER functions run as the schema's owner: only the roles
-- granted EXECUTE may call them (docs/deployment.md, "Roles and grants").
REVOKE ALL ON FUNCTION forward_partition_ensure(timestamptz, timestamptz, interval) FROM PUBLIC;

-- forward_partition_retire retires the partition of messages and attempts
-- that starts at p_lower: it drops both tables, with the delivery rows of
-- its FAILED messages, when every message in it is finished
-- (docs/architecture.md, "Retention"). Never a row-by-row DELETE of
-- messages: dropping a day writes a few kilobytes of WAL whatever it holds.
--
-- It returns one row: outcome RETIRED, KEPT (the counts say why), BUSY
-- (another retirement is running, or the tables could not be locked in
-- p_tries waits of p_lock_timeout_ms) or GONE (no such partition), with
-- the partition's messages (counted before the lock: a partition whose
-- range has passed gets no new rows) and its delivery rows by kind.
--
-- A partition stays, whole, while it holds a PENDING or IN_PROGRESS
-- delivery row, a FAILED row blocking its ordering key (order_blocked:
-- dropping it would leave the rows held behind it waiting for an operator
-- who can no longer see why), or, with p_keep_unpublished (the dead-letter
-- topic is in use), a FAILED row not yet published to it. Its other FAILED
-- rows go with it, and the retirement of a partition that held messages is
-- recorded in forward_operator_log (operator p_operator, filter naming the
-- range, p_note and the FAILED rows deleted).
--
-- The drop needs an ACCESS EXCLUSIVE lock on the two parent tables (DROP
-- of a partition takes it; DETACH ... CONCURRENTLY cannot run inside a
-- function or a transaction, and only for the tables' owner). It is asked
-- for with lock_timeout p_lock_timeout_ms, so that the statements queued
-- behind it wait at most that long, and asked again, up to p_tries times,
-- with a growing pause between; it is then held for the few milliseconds
-- of the checks and the drop. The checks are made again under the lock:
-- every statement that can give a message of this range an unfinished
-- delivery row (a requeue, which writes a REQUEUED attempt log; `requeue
-- --status SUCCESS`, which reads the message) uses one of the two tables,
-- so none can run between the checks and the drop. The delivery rows of the
-- range are found through the primary key: their ids are the ids of the
-- partition's messages, between its smallest and largest.
--
-- SECURITY DEFINER: the service's role drops no table itself; it needs only
-- EXECUTE on this. p_cutoff may not be in the future, so the partitions
-- being written to are out of its reach.
CREATE FUNCTION forward_partition_retire(p_lower timestamptz, p_cutoff timestamptz, p_keep_unpublished boolean,
                                         p_operator text, p_note text, p_lock_timeout_ms integer, p_tries integer)
RETURNS TABLE (outcome text, range_lower timestamptz, range_upper timestamptz, message_count bigint,
               failed_count bigint, pending_count bigint, in_progress_count bigint, blocked_count bigint,
               unpublished_count bigint, lock_waits integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '100ms' AS $$
DECLARE
    part  forward_partitions%ROWTYPE;
    lo_id bigint;
    hi_id bigint;
BEGIN
    outcome := 'GONE';
    range_lower := p_lower;
    message_count := 0; failed_count := 0; pending_count := 0; in_progress_count := 0;
    blocked_count := 0; unpublished_count := 0; lock_waits := 0;
    IF p_cutoff > now() THEN
        RAISE EXCEPTION 'retention cutoff % is in the future', p_cutoff USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One retirement at a time ('forwretr'): two would wait for each
    -- other's lock upgrade.
    IF NOT pg_try_advisory_xact_lock(7381244171629458546) THEN
        outcome := 'BUSY';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO part FROM forward_partitions p WHERE p.lower = p_lower;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    range_upper := part.upper;
    IF part.upper > p_cutoff THEN
        RAISE EXCEPTION 'partition from % to % is not older than the retention cutoff %', part.lower, part.upper, p_cutoff
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT count(*) INTO message_count
    FROM forward_messages m WHERE m.created_at >= part.lower AND m.created_at < part.upper;

    PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1)::text || 'ms', true);
    LOOP
        BEGIN
            EXECUTE format('LOCK TABLE ONLY forward_messages, ONLY forward_retry_logs, ONLY %I, ONLY %I IN ACCESS EXCLUSIVE MODE',
                           part.messages, part.retry_logs);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            lock_waits := lock_waits + 1;
            IF lock_waits >= p_tries THEN
                outcome := 'BUSY';
                RETURN NEXT;
                RETURN;
            END IF;
            PERFORM pg_sleep(least(0.05 * 2 ^ lock_waits, 1));
        END;
    END LOOP;

    SELECT min(m.id), max(m.id) INTO lo_id, hi_id
    FROM forward_messages m WHERE m.created_at >= part.lower AND m.created_at < part.upper;
    SELECT count(*) FILTER (WHERE d.status = 'PENDING'),
           count(*) FILTER (WHERE d.status = 'IN_PROGRESS'),
           count(*) FILTER (WHERE d.status = 'FAILED'),
           count(*) FILTER (WHERE d.order_blocked),
           count(*) FILTER (WHERE d.status = 'FAILED' AND d.dead_lettered_at IS NULL)
    INTO pending_count, in_progress_count, failed_count, blocked_count, unpublished_count
    FROM forward_deliveries d
    WHERE d.id BETWEEN lo_id AND hi_id AND d.created_at >= part.lower AND d.created_at < part.upper;
    IF pending_count + in_progress_count + blocked_count > 0 OR (p_keep_unpublished AND unpublished_count > 0) THEN
        outcome := 'KEPT';
        RETURN NEXT;
        RETURN;
    END IF;

    -- Only FAILED rows are left in the range: they go with their messages.
    DELETE FROM forward_deliveries d
    WHERE d.id BETWEEN lo_id AND hi_id AND d.created_at >= part.lower AND d.created_at < part.upper;
    EXECUTE format('DROP TABLE %I, %I', part.messages, part.retry_logs);
    DELETE FROM forward_partitions p WHERE p.lower = part.lower;
    INSERT INTO forward_operator_log (operator, action, filter, rows)
    SELECT p_operator, 'purge',
           format('partition %s to %s retired (%s)%s',
                  to_char(part.lower AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI"Z"'),
                  to_char(part.upper AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI"Z"'),
                  p_note,
                  CASE WHEN failed_count > 0 THEN format(', with its %s FAILED rows', failed_count) ELSE '' END),
           message_count
    WHERE message_count > 0;
    outcome := 'RETIRED';
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION forward_partition_retire(timestamptz, timestamptz, boolean, text, text, integer, integer) FROM PUBLIC;

-- Partitions for every day a schema-4 row was created on, and three ahead.
SELECT forward_partition_ensure(
    coalesce((SELECT min(created_at) FROM forward_records_v4), now()),
    now() + interval '3 days',
    interval '1 day');

-- The copy. Ids are kept: the attempt logs, the operator's notes and the
-- ordering (id order) refer to them.
INSERT INTO forward_messages (id, created_at, message_key, api_type, kafka_topic, kafka_partition,
                              kafka_offset, kafka_key, payload, plate_no, park_code, berth_code, device_id)
SELECT id, created_at, message_key, api_type, kafka_topic, kafka_partition,
       kafka_offset, kafka_key, payload, plate_no, park_code, berth_code, device_id
FROM forward_records_v4
ORDER BY id;
-- New ids follow every id schema 4 handed out, including those of rows
-- retention removed and of inserts that rolled back: an id names one
-- message forever (operator notes, logs).
SELECT setval('forward_messages_id_seq', s.last_value, s.is_called)
FROM forward_records_v4_id_seq s;

INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, next_retry_at,
                                payload_size, claim_token, claimed_by, claimed_at, last_http_status,
                                last_error, updated_at, failure_class, failed_at, requeue_rounds,
                                lease_returns, ordering_key, order_held, order_blocked,
                                dead_lettered_at, dead_letter_token, dead_letter_lease_until)
SELECT id, created_at, message_key, status, attempt_count, next_retry_at,
       octet_length(payload), claim_token, claimed_by, claimed_at, last_http_status,
       last_error, updated_at, failure_class, failed_at, requeue_rounds,
       lease_returns, ordering_key, order_held, order_blocked,
       dead_lettered_at, dead_letter_token, dead_letter_lease_until
FROM forward_records_v4
WHERE status <> 'SUCCESS'
ORDER BY id;

INSERT INTO forward_retry_logs (id, record_id, record_created_at, attempt_number, result_status,
                                http_status, platform_errcode, error_message, duration_ms,
                                attempted_at, next_retry_at, attempted_by)
SELECT l.id, l.record_id, r.created_at, l.attempt_number, l.result_status,
       l.http_status, l.platform_errcode, l.error_message, l.duration_ms,
       l.attempted_at, l.next_retry_at,
       -- The instance is known for the attempt that delivered a delivered
       -- row: its last SUCCESS (one requeued and delivered again has two).
       CASE WHEN r.status = 'SUCCESS' AND last_success.id IS NOT NULL THEN r.claimed_by END
FROM forward_retry_logs_v4 l
JOIN forward_records_v4 r ON r.id = l.record_id
LEFT JOIN (SELECT max(id) AS id FROM forward_retry_logs_v4 WHERE result_status = 'SUCCESS' GROUP BY record_id)
    AS last_success ON last_success.id = l.id
ORDER BY l.id;
-- Likewise for the attempt logs, before the logs added below take ids.
SELECT setval(pg_get_serial_sequence('forward_retry_logs', 'id'), s.last_value, s.is_called)
FROM forward_retry_logs_v4_id_seq s;
-- A delivered schema-4 row without a SUCCESS attempt (its logs purged)
-- gets one, so that the view still says when and how it was delivered.
INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status,
                                http_status, attempted_at, attempted_by)
SELECT r.id, r.created_at, r.attempt_count, 'SUCCESS', r.last_http_status,
       coalesce(r.succeeded_at, r.updated_at), r.claimed_by
FROM forward_records_v4 r
WHERE r.status = 'SUCCESS'
  AND NOT EXISTS (SELECT 1 FROM forward_retry_logs_v4 l WHERE l.record_id = r.id AND l.result_status = 'SUCCESS');

DROP TABLE forward_retry_logs_v4;
DROP TABLE forward_records_v4;

-- The message as one row, with the columns forward_records always had: a
-- delivered message (no delivery row) is SUCCESS, and its attempt count,
-- delivery time, HTTP status and instance come from its last attempt. For
-- reading (operators, dashboards, tests): the service writes the tables.
CREATE VIEW forward_records AS
SELECT m.id,
       m.message_key,
       m.api_type,
       m.kafka_topic,
       m.kafka_partition,
       m.kafka_offset,
       m.kafka_key,
       m.payload,
       coalesce(d.status, 'SUCCESS')                         AS status,
       CASE WHEN d.id IS NULL THEN coalesce(s.attempt_number, 0) ELSE d.attempt_count END AS attempt_count,
       d.next_retry_at,
       CASE WHEN d.id IS NULL THEN s.http_status ELSE d.last_http_status END AS last_http_status,
       d.last_error,
       m.created_at,
       coalesce(d.updated_at, s.attempted_at, m.created_at)  AS updated_at,
       CASE WHEN d.id IS NULL THEN coalesce(s.attempted_at, m.created_at) END AS succeeded_at,
       d.claim_token,
       CASE WHEN d.id IS NULL THEN s.attempted_by ELSE d.claimed_by END AS claimed_by,
       d.claimed_at,
       d.dead_lettered_at,
       d.dead_letter_token,
       d.dead_letter_lease_until,
       m.plate_no,
       m.park_code,
       m.berth_code,
       m.device_id,
       d.ordering_key,
       coalesce(d.order_held, false)                         AS order_held,
       coalesce(d.order_blocked, false)                      AS order_blocked,
       d.failure_class,
       d.failed_at,
       coalesce(d.requeue_rounds, 0)                         AS requeue_rounds,
       coalesce(d.lease_returns, 0)                          AS lease_returns
FROM forward_messages m
LEFT JOIN forward_deliveries d ON d.id = m.id
LEFT JOIN LATERAL (
    SELECT l.attempt_number, l.http_status, l.attempted_at, l.attempted_by
    FROM forward_retry_logs l
    WHERE d.id IS NULL AND l.record_id = m.id AND l.record_created_at = m.created_at
      AND l.result_status = 'SUCCESS'
    ORDER BY l.id DESC
    LIMIT 1) AS s ON true;
