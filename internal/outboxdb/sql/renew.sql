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
), locked AS (
    SELECT f.id
    FROM unnest($1::bigint[], $2::text[]) AS held (id, claim_token)
    JOIN forward_deliveries f ON f.id = held.id
    -- The join's condition again, as one the primary key answers: one probe
    -- per row whatever the statistics say (record.sql).
    WHERE f.id = ANY ($1::bigint[])
      AND f.claim_token::text = held.claim_token
      AND f.status = 'IN_PROGRESS'
    ORDER BY f.id
    FOR UPDATE OF f SKIP LOCKED
)
UPDATE forward_deliveries AS r
SET next_retry_at = now() + $3::bigint * interval '1 millisecond'
FROM locked, async
WHERE r.id = locked.id
  AND r.id = ANY ($1::bigint[])
RETURNING r.id, r.next_retry_at;
