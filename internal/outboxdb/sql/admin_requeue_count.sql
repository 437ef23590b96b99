-- Counts the rows `forwarder outbox requeue` would requeue (what it prints
-- before it starts, and its --dry-run), and the FAILED rows that match the
-- filter but are left out for their failure class. Its WHERE clause is
-- admin_requeue.sql's (admin_requeue_filter.sql), the class condition aside,
-- which is the FILTER here.
--
-- $1 statuses (text[]), $2 errcode (NULL: any), $3 updated within this many
-- milliseconds (NULL: any age), $4 message keys (NULL: any key), $5 failure
-- classes of the FAILED rows to requeue (text[]; rows without a class, from
-- before the classes existed, count as requeueable), $6 normalised reason
-- (NULL: any; the expression of console_failed_groups.sql).
-- Delivered messages (SUCCESS) have no delivery row: they are counted from
-- the messages, by their last attempt.
SELECT count(*) FILTER (WHERE r.status <> 'FAILED' OR r.failure_class IS NULL
                              OR r.failure_class = ANY ($5::text[]))
       + CASE WHEN 'SUCCESS' = ANY ($1::text[]) THEN (
             SELECT count(*)
             FROM forward_messages m
             LEFT JOIN LATERAL (
                 SELECT l.attempted_at, l.platform_errcode
                 FROM forward_retry_logs l
                 WHERE l.record_id = m.id AND l.record_created_at = m.created_at
                   AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
                 ORDER BY l.id DESC
                 LIMIT 1) AS last ON true
             WHERE ($4::text[] IS NULL OR m.message_key = ANY ($4::text[]))
               AND NOT EXISTS (SELECT 1 FROM forward_deliveries d WHERE d.id = m.id)
               AND ($3::bigint IS NULL OR last.attempted_at >= now() - $3::bigint * interval '1 millisecond')
               AND ($2::text IS NULL OR last.platform_errcode = $2::text)
               AND $6::text IS NULL)
         ELSE 0 END AS requeue,
       count(*) FILTER (WHERE r.status = 'FAILED' AND r.failure_class = 'REJECTED'
                              AND NOT r.failure_class = ANY ($5::text[])) AS left_rejected,
       count(*) FILTER (WHERE r.status = 'FAILED' AND r.failure_class = 'INVALID'
                              AND NOT r.failure_class = ANY ($5::text[])) AS left_invalid
FROM forward_deliveries r
WHERE (
    -- include: admin_requeue_filter.sql
);
