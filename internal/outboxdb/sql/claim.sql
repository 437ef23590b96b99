-- Claims up to $1 due rows for one dispatcher.
--
-- A row is due when it is PENDING and its retry time has come, or IN_PROGRESS
-- and its lease (kept in next_retry_at) has run out because its holder vanished.
-- The CTE reads through forward_records_due_idx in index order, so neither the
-- number of finished rows nor the backlog size adds a sort; SKIP LOCKED lets
-- any number of dispatchers claim side by side without waiting on each other.
--
-- Every claim is an attempt: attempt_count goes up here, not when the result
-- is written, so an attempt lost in a crash still counts. A fresh claim_token
-- fences the result write (see record.sql): a holder whose lease expired can no
-- longer change the row. An expired claim leaves a LEASE_EXPIRED attempt log.
--
-- $1 batch size, $2 lease in milliseconds, $3 claimer id.
WITH due AS (
    SELECT id, status AS prev_status, attempt_count AS prev_attempt, claimed_by AS prev_holder
    FROM forward_records
    WHERE status IN ('PENDING', 'IN_PROGRESS')
      AND next_retry_at <= now()
    ORDER BY next_retry_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), lost AS (
    INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, error_message)
    SELECT id, prev_attempt, 'LEASE_EXPIRED',
           'claim lease expired without a result (holder ' || coalesce(prev_holder, 'unknown') || ')'
    FROM due
    WHERE prev_status = 'IN_PROGRESS'
)
UPDATE forward_records AS r
SET status        = 'IN_PROGRESS',
    attempt_count = r.attempt_count + 1,
    next_retry_at = now() + $2 * interval '1 millisecond',
    claim_token   = gen_random_uuid(),
    claimed_by    = $3,
    claimed_at    = now(),
    updated_at    = now()
FROM due
WHERE r.id = due.id
RETURNING r.id, r.message_key, r.api_type, r.kafka_topic, r.kafka_partition,
          r.kafka_offset, r.kafka_key, r.payload, r.attempt_count,
          r.claim_token::text AS claim_token, r.created_at,
          r.next_retry_at AS lease_expires_at;
