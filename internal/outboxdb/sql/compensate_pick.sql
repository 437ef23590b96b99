-- The rows one batch of automatic compensation (compensate.sql) would take,
-- read without locks: their ordering keys are locked (order_lock.sql)
-- before compensate.sql, restricted to them, picks them again with the same
-- conditions and locks them. Reads forward_deliveries_compensation_idx.
--
-- $1 rounds, $2 delay after the failure in milliseconds, $3 batch size.
SELECT id
FROM forward_deliveries
WHERE status = 'FAILED'
  AND failure_class = 'TRANSIENT'
  AND requeue_rounds < $1::integer
  AND failed_at <= now() - $2::bigint * interval '1 millisecond'
ORDER BY requeue_rounds, failed_at
LIMIT $3;
