-- Claims up to $1 due rows for one dispatcher.
--
-- A row is due when it is PENDING and its retry time has come, or IN_PROGRESS
-- and its lease (kept in next_retry_at) has run out because its holder vanished.
-- The CTE reads through forward_records_due_idx in index order and stops after
-- $1 rows, so neither the number of finished rows nor the backlog size adds a
-- sort; SKIP LOCKED lets any number of dispatchers claim side by side without
-- waiting on each other or taking the same row.
--
-- Every claim is an attempt: attempt_count goes up here, not when the result
-- is written, so an attempt lost in a crash still counts. A fresh claim_token
-- fences the result write: a holder whose lease expired can no longer change
-- the row. An expired claim leaves a LEASE_EXPIRED attempt log.
--
-- A due row that has already used its $4 attempts is not sent again: it goes
-- FAILED here, in the same statement, with last_error saying why. That is what
-- ends a message that crashes its holder every time (its lease keeps expiring)
-- and a row released by nacks until its attempts ran out. $4 <= 0 means no
-- limit. Such rows come back with status FAILED and no claim token, and they
-- count against $1: the caller simply claims again.
--
-- $1 batch size, $2 lease in milliseconds, $3 claimer id, $4 max attempts.
WITH due AS (
    SELECT id,
           status        AS prev_status,
           attempt_count AS prev_attempt,
           claimed_by    AS prev_holder,
           ($4::integer > 0 AND attempt_count >= $4::integer) AS exhausted
    FROM forward_records
    WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
      AND next_retry_at <= now()
    ORDER BY next_retry_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), lost AS (
    INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, error_message)
    SELECT id, prev_attempt,
           CASE WHEN prev_status = 'IN_PROGRESS' THEN 'LEASE_EXPIRED' ELSE 'FAILED' END,
           CASE WHEN prev_status = 'IN_PROGRESS'
                THEN 'lease expired: attempt ' || prev_attempt || ' by '
                     || coalesce(prev_holder, 'unknown holder') || ' left no result'
                ELSE 'attempts exhausted: ' || prev_attempt || ' of ' || $4::integer
                     || ' attempts made without a result'
           END
    FROM due
    WHERE prev_status = 'IN_PROGRESS' OR exhausted
)
UPDATE forward_records AS r
SET status        = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN 'FAILED' ELSE 'IN_PROGRESS' END,
    attempt_count = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN r.attempt_count ELSE r.attempt_count + 1 END,
    next_retry_at = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN NULL ELSE now() + $2::bigint * interval '1 millisecond' END,
    claim_token   = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN NULL ELSE gen_random_uuid() END,
    claimed_by    = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN NULL ELSE $3::text END,
    claimed_at    = CASE WHEN $4::integer > 0 AND r.attempt_count >= $4::integer
                         THEN NULL ELSE now() END,
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
-- = ANY(ARRAY(...)) rather than a join with "due": it always reads the rows
-- through the primary key, where a join may be planned as a hash join over a
-- sequential scan of the whole table when the table is small or the
-- statistics are stale. The rows are locked by "due", so their old values
-- here (the r.* read by SET) are the ones "due" saw.
WHERE r.id = ANY (ARRAY(SELECT id FROM due))
RETURNING r.id, r.status, r.message_key, r.api_type, r.kafka_topic, r.kafka_partition,
          r.kafka_offset, r.kafka_key,
          CASE WHEN r.status = 'FAILED' THEN NULL ELSE r.payload END AS payload, r.attempt_count,
          r.claim_token::text AS claim_token, r.created_at,
          r.next_retry_at AS lease_expires_at, r.last_error;
