-- Promotes the first held row (lowest id) of each key in $1 that still has
-- nothing holding it (no head, no blocked row), due now, with an
-- ORDER_RELEASED attempt log saying the repair did it, and notifies the
-- dispatchers on channel $2. The keys come from order_repair_find.sql; the
-- caller has locked them (order_lock.sql) in an earlier statement of this
-- transaction, so the check here is current.
--
-- $1 ordering keys, $2 notification channel.
WITH orphaned AS (
    SELECT k.key,
           (SELECT h.id
            FROM forward_deliveries h
            WHERE h.ordering_key = k.key AND coalesce(h.order_held, false)
              -- order_idx's predicate, and coalesce() so that order_held_idx does not
              -- qualify: one key's entries of order_idx, never every held row in id order.
              AND (h.status IN ('PENDING', 'IN_PROGRESS') OR h.order_blocked)
            ORDER BY h.ordering_key, h.id
            LIMIT 1) AS next_id
    FROM (SELECT DISTINCT unnest($1::text[]) AS key) AS k
    WHERE NOT EXISTS (SELECT 1 FROM forward_deliveries o
                      WHERE o.ordering_key = k.key
                        AND (o.status IN ('PENDING', 'IN_PROGRESS') OR o.order_blocked) -- order_idx's predicate
                        AND ((o.status IN ('PENDING', 'IN_PROGRESS') AND NOT o.order_held) OR o.order_blocked))
), promoted AS (
    UPDATE forward_deliveries AS h
    SET order_held    = false,
        next_retry_at = now(),
        updated_at    = now()
    WHERE h.id = ANY (ARRAY(SELECT next_id FROM orphaned WHERE next_id IS NOT NULL))
      AND h.order_held
    RETURNING h.id, h.created_at, h.attempt_count, h.ordering_key
), released AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT id, created_at, attempt_count, 'ORDER_RELEASED',
           'released by the ordering repair: no row held its ordering key', now()
    FROM promoted
), notified AS (
    SELECT pg_notify($2::text, 'released')
    WHERE EXISTS (SELECT 1 FROM promoted)
)
SELECT id, ordering_key, (SELECT count(*) FROM notified) AS notified
FROM promoted
ORDER BY id;
