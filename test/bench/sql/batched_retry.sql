-- Hand-batched baseline: up to $1 rows whose POST failed and whose retry
-- time has come, to be sent again.
SELECT id, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload
FROM forward_records
WHERE status = 'PENDING' AND next_retry_at <= now()
ORDER BY next_retry_at
LIMIT $1;
