-- Renews the leases of claims their dispatcher still holds: rows waiting in
-- its pipeline or in flight to the platform keep their claim however long
-- the queue ahead of them is, so a documented lease never makes a held row
-- expire and go back unsent (docs/guarantees.md).
--
-- Fenced like a result write: only rows still IN_PROGRESS under the same
-- claim_token are renewed. Rows another transaction has locked are skipped,
-- not waited for: they are almost always having their result written by
-- the same instance's output, and a renewal that waited for them while
-- holding the locks of the rows it had already renewed could deadlock with
-- that result write, which locks the same rows in its own order; a skipped
-- row is renewed at the next look if it is still held. The caller tells a
-- skipped or finished row from a lost one with renew_settled.sql.
--
-- The commit need not wait for the WAL flush: a renewal lost in a database
-- crash only lets the row be claimed again sooner, which re-sends an
-- idempotent message (docs/architecture.md, "What may commit asynchronously").
--
-- $1 ids, $2 claim tokens (pairwise), $3 lease in milliseconds.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), tokens AS MATERIALIZED (
    -- include: held_tokens.sql
), locked AS (
    SELECT f.id
    FROM forward_deliveries f
    WHERE f.id = ANY ($1::bigint[])
      AND f.claim_token::text = (SELECT by_id FROM tokens) ->> f.id::text
      AND f.status = 'IN_PROGRESS'
    ORDER BY f.id
    FOR UPDATE OF f SKIP LOCKED
)
UPDATE forward_deliveries AS r
SET next_retry_at = now() + $3::bigint * interval '1 millisecond'
FROM async
-- The rows locked above, one probe each; locked, they are as checked.
WHERE r.id = ANY (ARRAY(SELECT id FROM locked))
RETURNING r.id, r.next_retry_at;
