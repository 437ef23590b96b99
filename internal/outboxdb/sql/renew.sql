-- Renews the leases of claims their dispatcher still holds: rows waiting in
-- its pipeline or in flight to the platform keep their claim however long
-- the queue ahead of them is, so a documented lease never makes a held row
-- expire and go back unsent (docs/guarantees.md).
--
-- Fenced like a result write: only rows still IN_PROGRESS under the same
-- claim_token are renewed; the ones that do not come back were lost (their
-- lease had run out and another dispatcher claimed them, or an operator
-- requeued them) and must not be sent any more.
--
-- The commit need not wait for the WAL flush: a renewal lost in a database
-- crash only lets the row be claimed again sooner, which re-sends an
-- idempotent message (docs/guarantees.md, "What may commit asynchronously").
--
-- $1 ids, $2 claim tokens (pairwise), $3 lease in milliseconds.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE forward_records AS r
SET next_retry_at = now() + $3::bigint * interval '1 millisecond'
FROM unnest($1::bigint[], $2::text[]) AS held (id, claim_token), async
WHERE r.id = held.id
  AND r.claim_token::text = held.claim_token
  AND r.status = 'IN_PROGRESS'
RETURNING r.id, r.next_retry_at;
