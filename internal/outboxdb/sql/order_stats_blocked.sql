-- The ordering keys blocked by a FAILED row (ordering with on_failed:
-- block), longest blocked first, for `forwarder outbox stats`: what
-- `forwarder outbox release` or `requeue` would unblock. Reads
-- forward_deliveries_order_blocked_idx and, per key, the rows held behind it
-- through forward_deliveries_order_idx.
--
-- $1 most keys listed.
SELECT b.ordering_key, b.id, b.message_key, b.failed_at, now() AS db_now,
       coalesce(b.last_error, '') AS last_error,
       (SELECT count(*)
        FROM forward_deliveries h
        WHERE h.ordering_key = b.ordering_key AND coalesce(h.order_held, false)
          -- order_idx's predicate, and coalesce() so that order_held_idx does not
          -- qualify: one key's entries of order_idx, never every held row in id order.
          AND (h.status IN ('PENDING', 'IN_PROGRESS') OR h.order_blocked)) AS held
FROM forward_deliveries b
WHERE b.order_blocked
ORDER BY b.failed_at, b.id
LIMIT $1;
