-- Gives dead-letter claims back unpublished: on a nack, and at shutdown for
-- rows claimed but not yet acknowledged. Fenced like deadletter_mark.sql. The
-- rows may be claimed again after $3 milliseconds (0: at once), so that a
-- topic that keeps refusing writes is retried at the poll interval rather
-- than in a tight loop.
--
-- $1 ids, $2 dead-letter tokens (pairwise with $1), $3 delay in milliseconds.
WITH tokens AS MATERIALIZED (
    -- include: held_tokens.sql
)
UPDATE forward_deliveries AS r
SET dead_letter_token       = NULL,
    dead_letter_lease_until = now() + $3::bigint * interval '1 millisecond'
WHERE r.id = ANY ($1::bigint[])
  AND r.dead_letter_token::text = (SELECT by_id FROM tokens) ->> r.id::text
  AND r.status = 'FAILED';
