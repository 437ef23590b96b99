-- The rows of a search by errcode (and neither plate, park, berth nor
-- device: those drive), through forward_retry_logs_errcode_idx
-- (platform_errcode, record_id) of every partition, merged: the logs with
-- the errcode, newest row first, each kept only when it is its row's latest
-- log (LEASE_EXPIRED and REQUEUED aside), so that every row comes once
-- (lookup_find.sql). The attempts of a message are in the partition of its
-- creation time, so the time filters leave out partitions here too. The
-- status is checked on the delivery row, as in lookup_find_messages.sql.
SELECT l.record_id AS id, l.record_created_at AS created_at
FROM forward_retry_logs l
LEFT JOIN forward_deliveries d ON d.id = l.record_id
WHERE l.platform_errcode >= @errcode::text AND l.platform_errcode <= @errcode::text
  AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
  AND NOT EXISTS (SELECT 1 FROM forward_retry_logs n
                  WHERE n.record_id = l.record_id AND n.record_created_at = l.record_created_at
                    AND n.id > l.id AND n.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED'))
  AND (@status::text IS NULL
       OR @status::text = 'SUCCESS' AND d.id IS NULL
       OR @status::text <> 'SUCCESS' AND d.status >= @status::text AND d.status <= @status::text)
  AND (@since::timestamptz IS NULL OR l.record_created_at >= @since::timestamptz)
  AND (@until::timestamptz IS NULL OR l.record_created_at < @until::timestamptz)
ORDER BY l.platform_errcode DESC, l.record_id DESC
LIMIT @limit
