-- Counts what `forwarder outbox purge --dry-run` would delete: SUCCESS rows
-- delivered before $1 (see admin_purge.sql).
SELECT count(*)
FROM forward_records
WHERE created_at < $1::timestamptz
  AND status = 'SUCCESS'
  AND succeeded_at < $1::timestamptz;
