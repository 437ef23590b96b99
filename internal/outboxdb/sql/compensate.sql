-- Automatic compensation: requeues one batch of rows FAILED because their
-- attempts ran out on transient or unavailable replies (failure_class
-- TRANSIENT) at least $2 milliseconds ago and requeued fewer than $1 times:
-- back to PENDING, due now, attempts reset, one round more, and a REQUEUED
-- attempt log. Rows the platform refused for good (REJECTED) and bad input
-- (INVALID) are never requeued here. After the last round a row stays
-- FAILED ("frozen") for an operator.
--
-- Reads forward_deliveries_compensation_idx in (requeue_rounds, failed_at)
-- order. SKIP LOCKED lets instances share the work without waiting on each
-- other or on an operator's requeue of the same rows. Requeued rows are
-- announced like new ones.
--
-- Ordering (docs/architecture.md, "Ordering"): the candidates come from
-- compensate_pick.sql ($5) and their ordering keys are locked first
-- (order_lock.sql, an earlier statement of this transaction), so this
-- statement sees the keys as they are. A requeued row with an ordering key
-- is held, as with an operator's requeue (requeue_held.sql), when its key
-- has a head, another blocked row, or an earlier row requeued in this
-- batch; it no longer blocks its key.
--
-- $1 rounds, $2 delay after the failure in milliseconds, $3 batch size,
-- $4 notification channel, $5 the candidate ids.
WITH picked AS (
    SELECT id, attempt_count, requeue_rounds, ordering_key
    FROM forward_deliveries
    WHERE id = ANY ($5::bigint[])
      AND status = 'FAILED'
      AND failure_class = 'TRANSIENT'
      AND requeue_rounds < $1::integer
      AND failed_at <= now() - $2::bigint * interval '1 millisecond'
    ORDER BY requeue_rounds, failed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE forward_deliveries AS r
    SET requeue_rounds = r.requeue_rounds + 1,
        order_held     = p.ordering_key IS NOT NULL AND (
            -- include: requeue_held.sql
        ),
        updated_at     = now(),
        -- include: requeue_reset.sql
    FROM picked p
    WHERE r.id = p.id
    RETURNING r.id, r.created_at, p.attempt_count, r.requeue_rounds
), logged AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT id, created_at, attempt_count, 'REQUEUED',
           'automatic compensation, round ' || requeue_rounds || ' of ' || $1::integer, now()
    FROM requeued
), notified AS (
    SELECT pg_notify($4::text, '')
    WHERE EXISTS (SELECT 1 FROM requeued)
)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM notified);
