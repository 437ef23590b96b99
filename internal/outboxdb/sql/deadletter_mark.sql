-- Marks rows published to the dead-letter topic once the output has
-- acknowledged them, so they are not published again.
--
-- Fenced by the claim: a row changes only while it is still FAILED under the
-- same dead_letter_token. A row requeued meanwhile (the requeue clears the
-- token) stays unmarked, so if it fails again it is published again; a row
-- whose lease ran out and that another instance took is left to that
-- instance, which publishes it once more (at-least-once). Tokens are compared
-- as text, as in release.sql.
--
-- $1 ids, $2 dead-letter tokens (pairwise with $1).
WITH tokens AS MATERIALIZED (
    -- include: held_tokens.sql
)
UPDATE forward_deliveries AS r
SET dead_lettered_at        = now(),
    dead_letter_token       = NULL,
    dead_letter_lease_until = NULL
WHERE r.id = ANY ($1::bigint[])
  AND r.dead_letter_token::text = (SELECT by_id FROM tokens) ->> r.id::text
  AND r.status = 'FAILED';
