-- Requeues one batch of matching rows for `forwarder outbox requeue`: back to
-- PENDING, due now, attempt_count 0, claim cleared, and one REQUEUED audit row
-- per record in forward_retry_logs, all in this one statement's transaction.
--
-- Batches walk the primary key ($7 is the last id of the previous batch), so a
-- large requeue holds its row locks briefly and every row is visited once even
-- when the requeued rows still match (--status PENDING). FOR UPDATE waits for a
-- claim or a result write in progress on the same row and then re-checks the
-- filter on the row's new version (READ COMMITTED), so a row claimed meanwhile
-- is left alone. Clearing claim_token fences out the old holder of an expired
-- lease: its late result write matches no row.
--
-- The row also leaves the dead-letter topic's bookkeeping (dead_lettered_at
-- and its claim): a row that fails again is published again, and a dead-letter
-- publish under way is fenced out.
--
-- FAILED rows are requeued only when their failure class is in $5: by
-- default TRANSIENT, because a row the platform refused for good (REJECTED:
-- errcode 998 or a no_retry rule) must not be re-sent unless an operator
-- asks, and a row that failed at ingest or in its mapping (INVALID) fails
-- again unless the input or the mapping was fixed.
--
-- Ordering (docs/architecture.md, "Ordering"): the caller holds the
-- ordering barrier exclusively (order_lock.sql), so no insert or result
-- write changes any key meanwhile and this statement's snapshot is current.
-- A requeued row with an ordering key is held when its key has another head
-- (a row due or in flight that is not held), another blocked row that is not
-- requeued here, or an earlier (lower id) row requeued in this batch: the
-- rows of one key keep their id order, promotion being by id, and the
-- database admits one head per key (forward_deliveries_order_head_key). A row
-- that is the head of its key already stays the head. A requeued row no
-- longer blocks its key (order_blocked is cleared), so requeueing a blocked
-- row makes it the head again.
--
-- The audit row's attempt_number is the number of attempts the row had made.
-- last_error and last_http_status are kept: they describe the last attempt
-- until the next one replaces them.
--
-- $1-$4 and $6 the filter (admin_requeue_filter.sql, shared with the count
-- the command prints first), $5 failure classes of the FAILED rows to
-- requeue (text[]; rows without a class count as requeueable), $7 last id
-- seen, $8 batch size, $9 audit message.
WITH picked AS (
    SELECT r.id, r.created_at, r.status AS prev_status, r.attempt_count AS prev_attempts, r.ordering_key,
           (r.status IN ('PENDING', 'IN_PROGRESS') AND NOT r.order_held) AS was_head
    FROM forward_deliveries r
    WHERE r.id > $7::bigint
      AND (
        -- include: admin_requeue_filter.sql
      )
      AND (r.status <> 'FAILED' OR r.failure_class IS NULL OR r.failure_class = ANY ($5::text[]))
    ORDER BY r.id
    LIMIT $8
    FOR UPDATE OF r
), held AS (
    SELECT p.id,
           p.ordering_key IS NOT NULL AND NOT p.was_head AND (
               -- include: requeue_held.sql
           ) AS held
    FROM picked p
), requeued AS (
    UPDATE forward_deliveries AS r
    SET order_held = held.held,
        updated_at = now(),
        -- include: requeue_reset.sql
    FROM held
    WHERE r.id = held.id
    RETURNING r.id
), audit AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT id, created_at, prev_attempts, 'REQUEUED',
           $9::text || ' (was ' || prev_status || ' after ' || prev_attempts
               || CASE WHEN prev_attempts = 1 THEN ' attempt)' ELSE ' attempts)' END,
           now()
    FROM picked
)
SELECT count(*) AS requeued, coalesce(max(id), 0) AS last_id
FROM requeued;
