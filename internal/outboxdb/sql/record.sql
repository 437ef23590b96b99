-- Records the result of one attempt for a batch of claimed rows and appends one
-- forward_retry_logs row per recorded attempt: one statement, so one
-- transaction and one round trip per batch (state change and attempt log can
-- never disagree).
--
-- Fencing: a row is written only while the caller still holds its claim, that
-- is the row still carries the caller's claim_token and is still IN_PROGRESS.
-- A holder whose lease expired and whose row was claimed again (new token), or
-- a repeated write of a result already recorded, changes nothing and leaves no
-- log row. RETURNING names the rows that were recorded, so the caller can tell
-- the lost claims apart. Repeating the statement is therefore harmless, which
-- makes it safe to retry after a connection error.
--
-- next_retry_at is computed on the database clock, as in claim.sql, so that
-- instances with skewed clocks agree on when a row is due. The claim token is
-- compared as text: a malformed token in a message matches nothing instead of
-- failing the whole batch on a cast.
--
-- An undone row ($9) was claimed but never sent (its lease was too short for
-- a request, or the output was stopping): it goes back to PENDING as if the
-- claim had not happened, with attempt_count back down, its last error kept
-- and no attempt logged, like an undone release (release.sql).
--
-- $1 ids, $2 claim tokens, $3 statuses left (SUCCESS | FAILED | PENDING),
-- $4 retry delays in ms (used for PENDING), $5 HTTP statuses, $6 errors
-- (last_error and the log's error_message), $7 platform errcodes,
-- $8 request durations in ms, $9 undo flags. $4..$8 may hold NULLs.
WITH result AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[],
                $5::integer[], $6::text[], $7::text[], $8::integer[], $9::boolean[])
        AS t(id, claim_token, status, retry_in_ms, http_status, error, errcode, duration_ms, undo)
), recorded AS (
    UPDATE forward_records AS r
    SET status           = result.status,
        next_retry_at    = CASE WHEN result.status = 'PENDING'
                                THEN now() + coalesce(result.retry_in_ms, 0) * interval '1 millisecond'
                           END,
        attempt_count    = CASE WHEN result.undo THEN greatest(r.attempt_count - 1, 0)
                                ELSE r.attempt_count END,
        last_http_status = CASE WHEN result.undo THEN r.last_http_status ELSE result.http_status END,
        last_error       = CASE WHEN result.undo THEN r.last_error ELSE result.error END,
        succeeded_at     = CASE WHEN result.status = 'SUCCESS' THEN now() END,
        updated_at       = now()
    FROM result
    WHERE r.id = result.id
      AND r.claim_token::text = result.claim_token
      -- IS TRUE keeps this test out of index conditions: the rows must be
      -- found by primary key, one probe per result, never by reading every
      -- IN_PROGRESS row of every instance through the status index, which
      -- the planner would pick whenever its statistics saw few of them.
      AND (r.status = 'IN_PROGRESS') IS TRUE
    RETURNING r.id, r.attempt_count, r.status, r.next_retry_at
), logged AS (
    INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status,
                                    platform_errcode, error_message, duration_ms, next_retry_at)
    SELECT recorded.id, recorded.attempt_count, recorded.status, result.http_status,
           result.errcode, result.error, result.duration_ms, recorded.next_retry_at
    FROM recorded
    JOIN result ON result.id = recorded.id
    WHERE NOT result.undo
)
SELECT id FROM recorded;
