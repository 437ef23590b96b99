-- The attempt log of one row, oldest first: the latest $2 entries, through
-- forward_retry_logs_record_id_idx, and how many there are in all.
-- $1 record id, $2 limit.
SELECT l.id, l.attempt_number, l.result_status, l.http_status, l.platform_errcode,
       l.error_message, l.duration_ms, l.attempted_at, l.next_retry_at,
       (SELECT count(*) FROM forward_retry_logs c WHERE c.record_id = $1::bigint) AS total
FROM (
    SELECT *
    FROM forward_retry_logs
    WHERE record_id = $1::bigint
    ORDER BY id DESC
    LIMIT $2
) l
ORDER BY l.id;
