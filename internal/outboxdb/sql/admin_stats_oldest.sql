-- The oldest row not yet delivered (PENDING or IN_PROGRESS), for
-- `forwarder outbox stats`. IN_PROGRESS counts too: a row cycling through
-- retries is IN_PROGRESS for the length of each attempt and its age must not
-- flicker. The scan reads forward_records_unfinished_status_idx only.
SELECT id, message_key, status, created_at, now() AS db_now
FROM forward_deliveries
WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
ORDER BY created_at, id
LIMIT 1;
