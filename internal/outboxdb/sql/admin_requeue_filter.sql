-- The filter of `forwarder outbox requeue` over r, a row of
-- forward_deliveries: included by admin_requeue.sql, which requeues the rows
-- it matches, and by admin_requeue_count.sql, which counts them beforehand
-- (what the command prints, and its --dry-run), so that both match the same
-- rows. The failure-class condition ($5) is each statement's own: the count
-- also reports the rows it leaves out.
--
-- $1 statuses (text[]), $2 errcode (NULL: any), $3 updated within this many
-- milliseconds (NULL: any age), $4 message keys (NULL: any key), $6
-- normalised reason (NULL: any; the expression of console_failed_groups.sql).
r.status = ANY ($1::text[])
-- An IN_PROGRESS row is taken only once its lease has run out: a live
-- holder may be talking to the platform right now.
AND (r.status <> 'IN_PROGRESS' OR r.next_retry_at <= now())
AND ($3::bigint IS NULL OR r.updated_at >= now() - $3::bigint * interval '1 millisecond')
AND ($4::text[] IS NULL OR r.message_key = ANY ($4::text[]))
AND ($2::text IS NULL OR (
      SELECT l.platform_errcode
      FROM forward_retry_logs l
      WHERE l.record_id = r.id AND l.record_created_at = r.created_at
        AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
      ORDER BY l.id DESC
      LIMIT 1) = $2::text)
AND ($6::text IS NULL OR left(regexp_replace(regexp_replace(coalesce(r.last_error, ''),
        '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
        '[0-9]{5,}', '<n>', 'g'), 200) = $6::text)
