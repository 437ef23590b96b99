-- The rows of a search by a status other than SUCCESS (and neither plate,
-- park, berth, device nor errcode: those drive), through
-- forward_deliveries_status_idx (status, updated_at): the most recently
-- changed rows first (lookup_find.sql). Only undelivered and FAILED
-- messages have a delivery row, so this walk never meets the delivered
-- bulk, and the delivery row carries the message's created_at for the time
-- filters. A row is updated no earlier than it was created, so a lower
-- bound on created_at bounds the walk too.
SELECT d.id, d.created_at
FROM forward_deliveries d
WHERE d.status >= @status::text AND d.status <= @status::text
  AND (@since::timestamptz IS NULL OR (d.updated_at >= @since::timestamptz
                                       AND d.created_at >= @since::timestamptz))
  AND (@until::timestamptz IS NULL OR d.created_at < @until::timestamptz)
ORDER BY d.status DESC, d.updated_at DESC, d.id DESC
LIMIT @limit
