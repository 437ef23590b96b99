-- The most frequent platform errcodes among FAILED rows, for
-- `forwarder outbox stats`. A row's errcode is the platform_errcode of its
-- latest attempt log, leaving out the bookkeeping rows (LEASE_EXPIRED,
-- REQUEUED) that carry none; '' when the row has no such log or the platform
-- sent no errcode (a mapping error, a timeout, an HTTP error). The same rule
-- serves `outbox requeue --errcode`. $1 is how many to return.
SELECT coalesce(l.platform_errcode, '') AS errcode, count(*) AS rows
FROM forward_deliveries r
LEFT JOIN LATERAL (
    SELECT platform_errcode
    FROM forward_retry_logs
    WHERE record_id = r.id AND record_created_at = r.created_at
      AND result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
    ORDER BY id DESC
    LIMIT 1
) l ON true
WHERE r.status = 'FAILED'
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT $1;
