-- Which of the claims a lease renewal did not find IN_PROGRESS were settled
-- by a result written under the same claim. The result write keeps the
-- row's claim_token (record.sql), and a claim token is held by one
-- dispatcher only, so such a row was finished by the holder's own output
-- before its dispatcher heard of it: settled, not lost. A row whose lease
-- ran out and that another dispatcher claimed carries a new token; a
-- requeued or released one carries none.
--
-- Its own statement, run after the renewal: a renewal that waited for a
-- concurrent result write sees the row as it was when the renewal began
-- (IN_PROGRESS), while this statement's snapshot shows the result.
--
-- $1 ids, $2 claim tokens (pairwise with $1).
SELECT r.id
FROM unnest($1::bigint[], $2::text[]) AS held (id, claim_token)
-- LATERAL: one primary-key probe per claim, whatever the statistics say.
CROSS JOIN LATERAL (
    SELECT f.id, f.status, f.claim_token
    FROM forward_records f
    WHERE f.id = held.id
) AS r
WHERE r.claim_token::text = held.claim_token
  AND r.status <> 'IN_PROGRESS';
