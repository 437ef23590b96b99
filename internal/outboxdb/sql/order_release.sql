-- Releases an ordering key blocked by a FAILED row (`forwarder outbox
-- release`, ordering with on_failed: block): the blocked row ($2, or every
-- blocked row of the key when NULL) stops holding the key, and the next row
-- held behind it (lowest id) is promoted, due now, with an ORDER_RELEASED
-- attempt log naming the operator and the released row, unless the key is
-- still held by a head or another blocked row. The FAILED row itself stays
-- FAILED (`outbox requeue` sends it again instead). One audit row goes to
-- forward_operator_log; the dispatchers are notified on channel $4.
--
-- The caller has locked the key (order_lock.sql) in an earlier statement of
-- the same transaction, so this statement sees the key as the last insert or
-- result write left it.
--
-- $1 ordering key, $2 the blocked row's id (NULL: all of the key's),
-- $3 operator, $4 notification channel.
WITH unblocked AS (
    UPDATE forward_deliveries
    SET order_blocked = false,
        updated_at    = now()
    WHERE ordering_key = $1::text
      AND order_blocked
      AND ($2::bigint IS NULL OR id = $2::bigint)
    RETURNING id, last_error
), holder AS (
    -- What still holds the key: a head, or a blocked row not released now.
    SELECT EXISTS (
        SELECT 1
        FROM forward_deliveries o
        WHERE o.ordering_key = $1::text
          AND (o.status IN ('PENDING', 'IN_PROGRESS') OR o.order_blocked) -- order_idx's predicate
          AND ((o.status IN ('PENDING', 'IN_PROGRESS') AND NOT o.order_held)
               OR (o.order_blocked AND o.id NOT IN (SELECT id FROM unblocked)))
    ) AS held
), successor AS (
    SELECT h.id
    FROM forward_deliveries h
    WHERE h.ordering_key = $1::text
      AND coalesce(h.order_held, false)
      -- order_idx's predicate, and coalesce() so that order_held_idx does not
      -- qualify: one key's entries of order_idx, never every held row in id order.
      AND (h.status IN ('PENDING', 'IN_PROGRESS') OR h.order_blocked)
    ORDER BY h.ordering_key, h.id
    LIMIT 1
), promoted AS (
    UPDATE forward_deliveries AS h
    SET order_held    = false,
        next_retry_at = now(),
        updated_at    = now()
    FROM successor, holder
    WHERE h.id = (SELECT id FROM successor)
      AND h.id = successor.id
      AND h.order_held
      AND NOT holder.held
      AND EXISTS (SELECT 1 FROM unblocked)
    RETURNING h.id, h.created_at, h.attempt_count
), released AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT p.id, p.created_at, p.attempt_count, 'ORDER_RELEASED',
           left('released by operator ' || $3::text || ': FAILED row '
                || (SELECT string_agg(u.id::text, ', ' ORDER BY u.id) FROM unblocked u)
                || ' no longer blocks the ordering key', 1024),
           now()
    FROM promoted p
), audit AS (
    INSERT INTO forward_operator_log (operator, action, filter, rows)
    SELECT $3::text, 'release',
           'ordering_key=' || $1::text || coalesce(' id=' || $2::bigint, ''),
           (SELECT count(*) FROM unblocked)
    WHERE EXISTS (SELECT 1 FROM unblocked)
), notified AS (
    SELECT pg_notify($4::text, 'released')
    WHERE EXISTS (SELECT 1 FROM promoted)
)
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM unblocked), '{}') AS unblocked,
       (SELECT id FROM promoted) AS promoted,
       (SELECT held FROM holder) AS still_held,
       (SELECT count(*) FROM notified) AS notified;
