-- The oldest row not yet delivered (PENDING or IN_PROGRESS), for
-- `forwarder outbox stats`. IN_PROGRESS counts too: a row cycling through
-- retries is IN_PROGRESS for the length of each attempt and its age must not
-- flicker. It reads forward_deliveries, which holds only the rows not yet
-- delivered and the FAILED ones.
SELECT id, message_key, status, created_at, now() AS db_now
FROM forward_deliveries
WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
ORDER BY created_at, id
LIMIT 1;
