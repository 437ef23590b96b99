-- Naive baseline, transaction 2 of 2 per message, first statement: the
-- attempt's outcome. $1 id, $2 status (SUCCESS, FAILED or PENDING),
-- $3 retry delay in ms (PENDING), $4 HTTP status (NULL for none),
-- $5 error (NULL for none).
UPDATE forward_records
SET status           = $2::text,
    attempt_count    = attempt_count + 1,
    next_retry_at    = CASE WHEN $2::text = 'PENDING' THEN now() + $3::bigint * interval '1 millisecond' END,
    last_http_status = $4,
    last_error       = $5,
    succeeded_at     = CASE WHEN $2::text = 'SUCCESS' THEN now() END,
    updated_at       = now()
WHERE id = $1
RETURNING attempt_count, next_retry_at;
