-- Counts the rows `forwarder outbox requeue` would requeue (its --dry-run).
-- The WHERE clause must stay identical to admin_requeue.sql's (a test runs
-- both over the same filters).
--
-- $1 statuses (text[]), $2 errcode (NULL: any), $3 updated within this many
-- milliseconds (NULL: any age), $4 message keys (NULL: any key).
SELECT count(*)
FROM forward_records r
WHERE r.status = ANY ($1::text[])
  -- An IN_PROGRESS row is taken only once its lease has run out: a live
  -- holder may be talking to the platform right now.
  AND (r.status <> 'IN_PROGRESS' OR r.next_retry_at <= now())
  AND ($3::bigint IS NULL OR r.updated_at >= now() - $3::bigint * interval '1 millisecond')
  AND ($4::text[] IS NULL OR r.message_key = ANY ($4::text[]))
  AND ($2::text IS NULL OR (
        SELECT l.platform_errcode
        FROM forward_retry_logs l
        WHERE l.record_id = r.id
          AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
        ORDER BY l.id DESC
        LIMIT 1) = $2::text);
