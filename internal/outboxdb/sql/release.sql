-- Gives claims back before their lease runs out: on a nack, on shutdown, or
-- when a claim was taken but never handed to the pipeline.
--
-- Fenced like a result write: a row changes only while it is still
-- IN_PROGRESS under the same claim_token, so a holder whose lease expired (and
-- whose row another dispatcher now holds), or whose result is already written,
-- changes nothing. The row goes back to PENDING, due after $3 milliseconds
-- (0: at once), with the claim cleared.
--
-- When $4 is true the claim is undone as if it never happened: the row was
-- never handed out, so attempt_count goes back down and no attempt is logged.
-- Otherwise the attempt stands (it may have reached the platform): it counts,
-- leaves $5 as last_error, its time as failed_attempt_at (the message's
-- previous failure, claim.sql) and an attempt log row, and a row released this way
-- on its last attempt is failed by the next claim instead of being sent again.
--
-- Released rows are announced on channel $6 so that idle dispatchers, on
-- any instance, pick them up at once.
--
-- Tokens are compared as text, as in record.sql: a malformed token matches
-- nothing instead of failing the whole batch on a cast.
--
-- $1 ids, $2 claim tokens (pairwise with $1), $3 delay in milliseconds,
-- $4 undo the attempt, $5 reason, $6 notification channel.
WITH tokens AS MATERIALIZED (
    -- include: held_tokens.sql
), released AS (
    UPDATE forward_deliveries AS r
    SET status        = 'PENDING',
        next_retry_at = now() + $3::bigint * interval '1 millisecond',
        attempt_count = CASE WHEN $4::boolean THEN greatest(r.attempt_count - 1, 0)
                             ELSE r.attempt_count END,
        last_error    = CASE WHEN $4::boolean THEN r.last_error ELSE $5::text END,
        claim_token   = NULL,
        claimed_by    = NULL,
        claimed_at    = NULL,
        failed_attempt_at = CASE WHEN $4::boolean THEN r.failed_attempt_at ELSE now() END,
        updated_at    = now()
    WHERE r.id = ANY ($1::bigint[])
      AND r.claim_token::text = (SELECT by_id FROM tokens) ->> r.id::text
      AND r.status = 'IN_PROGRESS'
    RETURNING r.id, r.created_at, r.attempt_count, r.next_retry_at
), logged AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT id, created_at, attempt_count, 'PENDING', $5::text, next_retry_at
    FROM released
    WHERE NOT $4::boolean
), notified AS (
    SELECT pg_notify($6::text, 'released')
    WHERE EXISTS (SELECT 1 FROM released)
)
SELECT (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM notified) AS notified;
