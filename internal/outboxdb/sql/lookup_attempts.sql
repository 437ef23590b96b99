-- The attempt log of one row, oldest first: the latest $2 entries, through
-- forward_retry_logs_record_id_idx of the partition of the row's creation
-- time ($3), and how many there are in all.
--
-- attempt_number is numbered over the row's whole life. The stored number
-- restarts after a requeue, which resets attempt_count (a fresh budget of
-- attempts), so a row refused, requeued and delivered would show two
-- attempts #1; the REQUEUED entries store the attempts made before them,
-- and their running sum is added here (a REQUEUED entry itself shows the
-- attempts made so far).
-- $1 record id, $2 limit, $3 the row's created_at.
SELECT l.id, l.attempt_number, l.result_status, l.http_status, l.platform_errcode,
       l.error_message, l.duration_ms, l.attempted_at, l.next_retry_at,
       (SELECT count(*) FROM forward_retry_logs c
        WHERE c.record_id = $1::bigint AND c.record_created_at = $3::timestamptz) AS total
FROM (
    SELECT n.*
    FROM (
        SELECT f.id, f.result_status, f.http_status, f.platform_errcode, f.error_message,
               f.duration_ms, f.attempted_at, f.next_retry_at,
               f.attempt_number + coalesce(sum(f.attempt_number) FILTER (WHERE f.result_status = 'REQUEUED')
                   OVER (ORDER BY f.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS attempt_number
        FROM forward_retry_logs f
        WHERE f.record_id = $1::bigint AND f.record_created_at = $3::timestamptz
    ) n
    ORDER BY n.id DESC
    LIMIT $2
) l
ORDER BY l.id;
