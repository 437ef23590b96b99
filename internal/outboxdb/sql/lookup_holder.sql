-- The row a held row waits behind, for `forwarder outbox show` and the
-- console's record page ($1: the held row's ordering key, $2: its id): the
-- key's head (due, waiting for a retry or in flight) or the FAILED row
-- blocking the key, and how many rows of the key are held before this one.
-- Both read forward_deliveries_order_idx for the one key.
SELECT d.id, d.message_key, d.status, d.attempt_count, d.next_retry_at, d.last_error, d.order_blocked,
       (SELECT count(*)
        FROM forward_deliveries h
        WHERE h.ordering_key = $1::text AND h.id < $2::bigint AND h.order_held
          AND h.status IN ('PENDING', 'IN_PROGRESS')) AS held_before
FROM forward_deliveries d
WHERE d.ordering_key = $1::text AND d.id <> $2::bigint
  AND ((d.status IN ('PENDING', 'IN_PROGRESS') AND NOT d.order_held) OR d.order_blocked)
ORDER BY d.id
LIMIT 1;
