-- Finds ordering keys that have held rows but nothing holding them: no head
-- (a row of the key due or in flight, not held) and no blocked FAILED row.
-- The lock protocol (order_lock.sql) makes this impossible; the ordering
-- repair looks anyway, once a minute, so that a row held by mistake (a bug,
-- a hand-made change) is released instead of waiting forever.
--
-- Read without locks: a key found here is locked and checked again before
-- anything changes (order_repair.sql). The distinct keys of
-- forward_deliveries_order_idx (unfinished and blocked ordered rows) are
-- walked one index probe per key (a loose index scan), so the cost grows
-- with the number of active keys, not with the rows held behind them.
--
-- $1 most keys returned.
WITH RECURSIVE keys AS (
    (SELECT ordering_key
     FROM forward_deliveries
     WHERE ordering_key IS NOT NULL
       AND (status IN ('PENDING', 'IN_PROGRESS') OR order_blocked)
     ORDER BY ordering_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT f.ordering_key
            FROM forward_deliveries f
            WHERE f.ordering_key > keys.ordering_key
              AND (f.status IN ('PENDING', 'IN_PROGRESS') OR f.order_blocked)
            ORDER BY f.ordering_key
            LIMIT 1)
    FROM keys
    WHERE keys.ordering_key IS NOT NULL
)
SELECT k.ordering_key
FROM keys k
WHERE k.ordering_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM forward_deliveries h
              WHERE h.ordering_key = k.ordering_key AND coalesce(h.order_held, false)
                -- order_idx's predicate, and coalesce() so that order_held_idx does not
                -- qualify: one key's entries of order_idx, never every held row in id order.
                AND (h.status IN ('PENDING', 'IN_PROGRESS') OR h.order_blocked))
  AND NOT EXISTS (SELECT 1 FROM forward_deliveries o
                  WHERE o.ordering_key = k.ordering_key
                    AND (o.status IN ('PENDING', 'IN_PROGRESS') OR o.order_blocked) -- order_idx's predicate
                    AND ((o.status IN ('PENDING', 'IN_PROGRESS') AND NOT o.order_held) OR o.order_blocked))
LIMIT $1;
