-- migration: online

-- One row per Kafka message, updated in place as it moves through
-- PENDING -> IN_PROGRESS -> SUCCESS | FAILED (or back to PENDING for a retry).
CREATE TABLE forward_records (
    -- Identity keys grow monotonically like Snowflake IDs (index friendly)
    -- without clock assumptions; idempotency is carried by message_key.
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_key      text        NOT NULL,
    api_type         text        NOT NULL,
    kafka_topic      text        NOT NULL,
    kafka_partition  integer     NOT NULL,
    kafka_offset     bigint      NOT NULL,
    -- Kafka keys and payloads are arbitrary bytes: bytea keeps them byte for
    -- byte, including bytes that are not valid UTF-8.
    kafka_key        bytea,
    payload          bytea       NOT NULL,
    status           text        NOT NULL DEFAULT 'PENDING',
    attempt_count    integer     NOT NULL DEFAULT 0,
    -- When the row is next due for a claim: for PENDING the (re)try time, for
    -- IN_PROGRESS the end of the claim lease (an expired lease makes the row due
    -- again), NULL once the row is SUCCESS or FAILED. One column for both lets one
    -- partial index serve the whole claim query.
    next_retry_at    timestamptz DEFAULT now(),
    last_http_status integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    succeeded_at     timestamptz,
    -- Fencing: a result is written only by the holder of the current claim.
    claim_token      uuid,
    claimed_by       text,
    claimed_at       timestamptz,

    CONSTRAINT forward_records_message_key_key UNIQUE (message_key),
    CONSTRAINT forward_records_status_check
        CHECK (status IN ('PENDING', 'IN_PROGRESS', 'SUCCESS', 'FAILED')),
    CONSTRAINT forward_records_due_check
        CHECK ((status IN ('PENDING', 'IN_PROGRESS')) = (next_retry_at IS NOT NULL)),
    CONSTRAINT forward_records_attempt_count_check CHECK (attempt_count >= 0)
);

-- Serves the claim: WHERE status IN (...) AND next_retry_at <= now()
-- ORDER BY next_retry_at, id LIMIT n FOR UPDATE SKIP LOCKED. Finished rows are
-- not in it, so a claim costs the same at 0 or 10 M finished rows.
CREATE INDEX forward_records_due_idx ON forward_records (next_retry_at, id)
    WHERE status IN ('PENDING', 'IN_PROGRESS');

-- Exact, cheap counts of the unfinished statuses (gauges, stats) and requeue
-- filters on FAILED rows, without touching the SUCCESS majority.
CREATE INDEX forward_records_unfinished_status_idx ON forward_records (status, updated_at)
    WHERE status <> 'SUCCESS';

-- Retention: purge walks finished rows by age.
CREATE INDEX forward_records_created_at_idx ON forward_records (created_at);

-- Append-only, one row per attempt (and per lease expiry or operator requeue).
CREATE TABLE forward_retry_logs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_id        bigint      NOT NULL REFERENCES forward_records (id) ON DELETE CASCADE,
    attempt_number   integer     NOT NULL,
    -- The status the attempt left the row in (SUCCESS, FAILED, PENDING), or
    -- LEASE_EXPIRED for an attempt whose holder vanished, or REQUEUED for an
    -- operator's requeue.
    result_status    text        NOT NULL,
    http_status      integer,
    platform_errcode text,
    error_message    text,
    duration_ms      integer,
    attempted_at     timestamptz NOT NULL DEFAULT now(),
    next_retry_at    timestamptz
);

CREATE INDEX forward_retry_logs_record_id_idx ON forward_retry_logs (record_id);
