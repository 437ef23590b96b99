-- Hand-batched baseline: the outcomes of one batch of POSTs and their
-- attempt logs in one statement. $1 ids, $2 statuses, $3 retry delays in ms,
-- $4 HTTP statuses, $5 errors, $6 platform errcodes, $7 durations in ms
-- ($3..$7 may hold NULLs).
WITH result AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::integer[], $5::text[],
                $6::text[], $7::integer[])
        AS t(id, status, retry_in_ms, http_status, error, errcode, duration_ms)
), recorded AS (
    UPDATE forward_records AS r
    SET status           = result.status,
        attempt_count    = r.attempt_count + 1,
        next_retry_at    = CASE WHEN result.status = 'PENDING'
                                THEN now() + coalesce(result.retry_in_ms, 0) * interval '1 millisecond' END,
        last_http_status = result.http_status,
        last_error       = result.error,
        succeeded_at     = CASE WHEN result.status = 'SUCCESS' THEN now() END,
        updated_at       = now()
    FROM result
    WHERE r.id = result.id
    RETURNING r.id, r.attempt_count, r.status, r.next_retry_at
)
INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status,
                                platform_errcode, error_message, duration_ms, next_retry_at)
SELECT recorded.id, recorded.attempt_count, recorded.status, result.http_status,
       result.errcode, result.error, result.duration_ms, recorded.next_retry_at
FROM recorded
JOIN result ON result.id = recorded.id;
