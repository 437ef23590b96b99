-- The platform errcode of each given row's latest attempt (LEASE_EXPIRED and
-- REQUEUED logs aside, as in `outbox stats`), for the rows a search found:
-- one probe of forward_retry_logs_record_id_idx each, in the partition of
-- the row's creation time. Rows without such an attempt are left out.
-- $1 record ids, $2 their created_at (at most the search's limit).
SELECT f.id AS record_id, e.platform_errcode
FROM unnest($1::bigint[], $2::timestamptz[]) AS f(id, created_at)
CROSS JOIN LATERAL (
    SELECT l.platform_errcode
    FROM forward_retry_logs l
    WHERE l.record_id = f.id AND l.record_created_at = f.created_at
      AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
    ORDER BY l.id DESC
    LIMIT 1) e;
