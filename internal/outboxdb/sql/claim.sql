-- Claims up to $1 due rows for one dispatcher.
--
-- A row is due when it is PENDING and its retry time has come, or IN_PROGRESS
-- and its lease (kept in next_retry_at) has run out because its holder
-- vanished. Rows held behind an earlier row of their ordering key are not
-- due: they are not in forward_deliveries_due_idx at all. The "locked" CTE reads
-- through that index in index order and stops after $1 rows, so neither the
-- number of finished or held rows nor the backlog size adds a sort; SKIP
-- LOCKED lets any number of dispatchers claim side by side without waiting on
-- each other or taking the same row.
--
-- The payload bytes of the rows claimed are bounded too ($5, < 0: no bound),
-- so that a claim of large messages cannot take more memory than the
-- dispatcher has room for: rows are taken in due order while their running
-- total fits, and the first one always (a message larger than the budget is
-- still delivered, alone). Rows locked by "locked" but left out by "due" are
-- not changed; their locks go with the statement. The sizes are the delivery
-- rows' payload_size: the messages are read only for the rows claimed.
--
-- Every claim is an attempt: attempt_count goes up here, not when the result
-- is written, so an attempt lost in a crash still counts. A fresh claim_token
-- fences the result write: a holder whose lease expired can no longer change
-- the row. An expired claim leaves a LEASE_EXPIRED attempt log.
--
-- A due row that has already used its $4 attempts is not sent again: it is
-- claimed without counting an attempt and comes back flagged "exhausted",
-- with the reason it must fail, and the dispatcher records it FAILED at once
-- through the result write (record.sql), which is what releases the next
-- row of its ordering key. That is what ends a message that crashes its
-- holder every time (its lease keeps expiring) and a row released by nacks
-- until its attempts ran out. $4 <= 0 means no limit.
--
-- The commit need not wait for the WAL flush: a claim lost in a database
-- crash leaves the row as it was, to be claimed again, which at worst
-- re-sends an idempotent message (docs/architecture.md, "What may commit
-- asynchronously").
--
-- $1 batch size, $2 lease in milliseconds, $3 claimer id, $4 max attempts,
-- $5 payload byte budget.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), locked AS (
    SELECT id, next_retry_at,
           status        AS prev_status,
           attempt_count AS prev_attempt,
           claimed_by    AS prev_holder,
           CASE WHEN status = 'PENDING' THEN failed_attempt_at END AS prev_failure,
           payload_size  AS size
    FROM forward_deliveries
    -- locked: begin (claim_probe.sql replaces which rows are locked)
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
      AND next_retry_at <= now()
    ORDER BY next_retry_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
    -- locked: end
), due AS (
    SELECT id, prev_status, prev_attempt, prev_holder, prev_failure,
           ($4::integer > 0 AND prev_attempt >= $4::integer) AS exhausted
    FROM (SELECT *,
                 sum(size) OVER (ORDER BY next_retry_at, id) AS running,
                 row_number() OVER (ORDER BY next_retry_at, id) AS n
          FROM locked) AS l
    WHERE $5::bigint < 0 OR n = 1 OR running <= $5::bigint
), claimed AS (
    -- The SET expressions read the old values of each row (r.*), the ones
    -- "locked" saw, since the rows are locked.
    UPDATE forward_deliveries AS r
    SET status        = 'IN_PROGRESS',
        attempt_count = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                             THEN r.attempt_count ELSE r.attempt_count + 1 END,
        next_retry_at = now() + $2::bigint * interval '1 millisecond',
        claim_token   = gen_random_uuid(),
        claimed_by    = $3::text,
        claimed_at    = now(),
        last_error    = CASE
                            WHEN NOT ($4::integer > 0 AND r.attempt_count >= $4::integer) THEN r.last_error
                            WHEN r.status = 'IN_PROGRESS'
                            THEN 'lease expired: attempt ' || r.attempt_count || ' of ' || $4::integer
                                 || ' by ' || coalesce(r.claimed_by, 'unknown holder')
                                 || ' left no result; no attempts left'
                            ELSE 'attempts exhausted: ' || r.attempt_count || ' of ' || $4::integer
                                 || ' attempts made without a result; last error: '
                                 || coalesce(r.last_error, 'none')
                        END,
        updated_at    = now()
    -- = ANY(ARRAY(...)) rather than a join with "due": it always reads the
    -- rows through the primary key, where a join may be planned as a hash
    -- join over a sequential scan of the whole table when the table is small
    -- or the statistics are stale.
    WHERE r.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING r.id, r.created_at, r.attempt_count, r.claim_token, r.claimed_by, r.next_retry_at, r.last_error
), lost AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message)
    SELECT due.id, claimed.created_at, due.prev_attempt, 'LEASE_EXPIRED',
           'lease expired: attempt ' || due.prev_attempt || ' by '
           || coalesce(due.prev_holder, 'unknown holder') || ' left no result'
    FROM due
    JOIN claimed ON claimed.id = due.id
    WHERE due.prev_status = 'IN_PROGRESS'
)
-- The claimed rows as forward_records shows them, their message read by
-- (id, created_at): one partition per row (run-time pruning). The LATERAL
-- subquery, kept apart by its LIMIT, gives the partitions both values of
-- the same claimed row: as a plain join, the planner may probe every
-- partition by id (from due, equal to it) and check created_at afterwards,
-- which at 10 M rows over 35 daily partitions made the claim 2-3 times
-- slower (docs/benchmarks.md, "Scale"). An exhausted row's last_error names
-- why it must fail. trace_parent continues the message's trace
-- (docs/operations.md, "Tracing"). previous_failure_at is when an
-- attempt last failed for the row, on whichever instance (failed_attempt_at:
-- that result write's time, or a give-back's that kept its attempt; NULL
-- when it has not failed since it was stored or last requeued): the
-- platform's protection counts the row's next failure only once the
-- platform has answered a request sent after that one (docs/architecture.md,
-- "Protecting the platform").
SELECT m.id, m.message_key, m.api_type, m.kafka_topic, m.kafka_partition, m.kafka_offset,
       m.kafka_key, m.payload, m.created_at, m.trace_parent,
       'IN_PROGRESS' AS status, c.attempt_count, c.claim_token::text AS claim_token, c.claimed_by,
       c.next_retry_at, c.last_error, due.exhausted, due.prev_failure AS previous_failure_at
FROM claimed c
JOIN due ON due.id = c.id
CROSS JOIN LATERAL (
    SELECT fm.id, fm.message_key, fm.api_type, fm.kafka_topic, fm.kafka_partition, fm.kafka_offset,
           fm.kafka_key, fm.payload, fm.created_at, fm.trace_parent
    FROM forward_messages fm
    WHERE fm.id = c.id AND fm.created_at = c.created_at
    LIMIT 1) AS m
CROSS JOIN async
WHERE async.done = 'off';
