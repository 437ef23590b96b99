-- Which of the claims a lease renewal did not renew are not lost: the row
-- still carries the caller's claim_token. A claim token is held by one
-- dispatcher only, so such a row is either finished by a result written
-- under that claim (the result write keeps the token, record.sql: the
-- holder's own output was faster than its acknowledgement), or still
-- IN_PROGRESS and was skipped because another transaction had it locked
-- (renew.sql), to be renewed at the next look. A row whose lease ran out
-- and that another dispatcher claimed carries a new token; a requeued or
-- released one carries none: those are lost. A delivered row has no
-- delivery row left: it is settled when its SUCCESS attempt was this
-- dispatcher's ($3), lost when another dispatcher delivered it.
--
-- Its own statement, run after the renewal: a result write that committed
-- while the renewal ran is seen here.
--
-- $1 ids, $2 claim tokens (pairwise with $1), $3 the dispatcher (claimer).
SELECT held.id
FROM unnest($1::bigint[], $2::text[]) AS held (id, claim_token)
-- LATERAL: one primary-key probe per claim, whatever the statistics say.
LEFT JOIN LATERAL (
    SELECT f.claim_token
    FROM forward_deliveries f
    WHERE f.id = held.id
      -- The condition again, as one the primary key answers: one probe per
      -- row whatever the statistics say (record.sql).
      AND f.id = ANY ($1::bigint[])
) AS r ON true
WHERE r.claim_token::text = held.claim_token
   OR (r IS NULL AND EXISTS (
        SELECT 1
        FROM forward_retry_logs l
        WHERE l.record_id = held.id AND l.result_status = 'SUCCESS' AND l.attempted_by = $3::text));
