-- migration: online

-- Per-key ordering, platform protection, lookups by plate/park/berth/device,
-- bounded give-backs of unsent claims, and the operators' audit trail
-- (docs/guarantees.md, docs/architecture.md).
ALTER TABLE forward_records
    -- Copied from the payload at ingest (when it is a JSON object holding
    -- them as strings), so that `outbox find` and the console look rows up
    -- through an index instead of parsing payloads. NULL when absent.
    ADD COLUMN plate_no       text,
    ADD COLUMN park_code      text,
    ADD COLUMN berth_code     text,
    ADD COLUMN device_id      text,
    -- Rows with the same ordering key are delivered in id order (the order
    -- they were persisted in), one at a time; NULL: not ordered.
    ADD COLUMN ordering_key   text,
    -- A PENDING row waiting for an earlier row of its key to finish. It is
    -- not due and not in forward_records_due_idx; the result write that
    -- finishes the earlier row releases it.
    ADD COLUMN order_held     boolean NOT NULL DEFAULT false,
    -- A FAILED row that holds its key (ordering with on_failed: block) until
    -- an operator requeues or releases it.
    ADD COLUMN order_blocked  boolean NOT NULL DEFAULT false,
    -- Why a FAILED row failed: TRANSIENT (out of attempts on retryable or
    -- unavailable replies, or on lost claims: automatic compensation may
    -- requeue it), REJECTED (the platform refused it for good, errcode 998
    -- or a no_retry rule) or INVALID (bad input or a mapping error). NULL for
    -- rows that are not FAILED.
    ADD COLUMN failure_class  text,
    -- When the row last became FAILED; the compensation delay counts from it.
    ADD COLUMN failed_at      timestamptz,
    -- Automatic compensation rounds used (each one a REQUEUED attempt log).
    ADD COLUMN requeue_rounds integer NOT NULL DEFAULT 0,
    -- Claims given back unsent in a row for lack of lease; past a small bound
    -- the next one counts as an attempt, so a row is never returned forever.
    ADD COLUMN lease_returns  integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT forward_records_failure_class_check
        CHECK (failure_class IS NULL OR failure_class IN ('TRANSIENT', 'REJECTED', 'INVALID')),
    ADD CONSTRAINT forward_records_order_held_check
        CHECK (NOT order_held OR (status = 'PENDING' AND ordering_key IS NOT NULL)),
    ADD CONSTRAINT forward_records_order_blocked_check
        CHECK (NOT order_blocked OR (status = 'FAILED' AND ordering_key IS NOT NULL));

-- Rows already FAILED: classify them from what they say, so that automatic
-- compensation and requeue filters treat them like new ones. Reads FAILED
-- rows only (through forward_records_unfinished_status_idx).
UPDATE forward_records AS r
SET failure_class = CASE
        WHEN r.attempt_count = 0 THEN 'INVALID'
        WHEN r.last_error LIKE 'mapping:%' THEN 'INVALID'
        WHEN EXISTS (SELECT 1 FROM forward_retry_logs l
                     WHERE l.record_id = r.id AND l.platform_errcode = '998') THEN 'REJECTED'
        WHEN r.last_error LIKE 'not retried%' THEN 'REJECTED'
        ELSE 'TRANSIENT'
    END,
    failed_at = r.updated_at
WHERE r.status = 'FAILED';

-- The claim reads only rows that may be sent: rows held behind an earlier
-- row of their key are left out, so a key with a long queue does not make
-- claims of other keys any slower.
DROP INDEX forward_records_due_idx;
CREATE INDEX forward_records_due_idx ON forward_records (next_retry_at, id)
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;

-- At most one row per ordering key may be due or in flight: the head. The
-- database refuses a second one, whatever a claim, a retry or a requeue does.
CREATE UNIQUE INDEX forward_records_order_head_key ON forward_records (ordering_key)
    WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held;

-- The rows that hold a key: unfinished ones (the head and the rows held
-- behind it, in id order) and a FAILED row blocking it. A new row of a key
-- found here is held; the next held row is found here when the head ends.
CREATE INDEX forward_records_order_idx ON forward_records (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND (status IN ('PENDING', 'IN_PROGRESS') OR order_blocked);

-- Raised by the insert (insert.sql) when a new row would wait behind an
-- active row of an ordering key whose lock it did not take: the row became
-- active after the insert chose its locks (order_lock_active.sql). The
-- insert is run again, and then takes the lock.
CREATE FUNCTION forward_records_order_conflict(key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ordering key % gained an active row after the insert chose its locks', key
        USING ERRCODE = 'serialization_failure';
END
$$;

-- Exact, cheap counts for the ordering gauges.
CREATE INDEX forward_records_order_held_idx ON forward_records (id) WHERE order_held;
CREATE INDEX forward_records_order_blocked_idx ON forward_records (ordering_key) WHERE order_blocked;

-- Automatic compensation: FAILED rows that may be requeued, oldest failure first.
CREATE INDEX forward_records_compensation_idx ON forward_records (requeue_rounds, failed_at)
    WHERE status = 'FAILED' AND failure_class = 'TRANSIENT';

-- Lookups, newest first: by plate, by park (and berth), by berth, by device.
CREATE INDEX forward_records_plate_idx  ON forward_records (plate_no, id)   WHERE plate_no IS NOT NULL;
CREATE INDEX forward_records_park_idx   ON forward_records (park_code, berth_code, id) WHERE park_code IS NOT NULL;
CREATE INDEX forward_records_berth_idx  ON forward_records (berth_code, id) WHERE berth_code IS NOT NULL;
CREATE INDEX forward_records_device_idx ON forward_records (device_id, id)  WHERE device_id IS NOT NULL;

-- The state every instance shares about the platform: the circuit breaker,
-- a pause asked for by Retry-After, and the token bucket of the global rate
-- limit. One row; instances read it often and change it rarely.
CREATE TABLE forward_platform_state (
    id               boolean     PRIMARY KEY DEFAULT true CHECK (id),
    -- CLOSED: sending; OPEN: only probes; HALF_OPEN: a probe succeeded,
    -- sending resumes with concurrency ramping up.
    breaker_state    text        NOT NULL DEFAULT 'CLOSED'
        CHECK (breaker_state IN ('CLOSED', 'OPEN', 'HALF_OPEN')),
    changed_at       timestamptz NOT NULL DEFAULT now(),
    changed_by       text,
    reason           text,
    -- While OPEN, the next probe may be sent from this time on, by the one
    -- instance that moves it forward first.
    next_probe_at    timestamptz NOT NULL DEFAULT now(),
    -- No request before this time (a Retry-After on 429/503).
    paused_until     timestamptz NOT NULL DEFAULT 'epoch',
    -- Token bucket of the global rate limit; it starts full (the limit
    -- caps it at one second's worth when first used).
    rate_tokens      float8      NOT NULL DEFAULT 'Infinity',
    rate_refilled_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO forward_platform_state DEFAULT VALUES;

-- What operators did (requeue, release, purge, console actions): who, what,
-- how many rows. Per-row requeues also leave a REQUEUED attempt log.
CREATE TABLE forward_operator_log (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    operator  text        NOT NULL,
    action    text        NOT NULL,
    filter    text        NOT NULL,
    rows      bigint      NOT NULL
);
