-- insert_count.sql for an outbox processor whose own process runs a
-- dispatcher with room to spare: the rows marked IN_PROGRESS in $8 are
-- inserted already claimed by $12 for a lease of $11 milliseconds (attempt 1,
-- a fresh claim_token), exactly as claim.sql would leave them, and handed to
-- that dispatcher in memory. That saves the NOTIFY, the claim statement and a
-- second version of every row; should the process die before a result is
-- written, the lease brings the rows back like any other claim.
--
-- Rows inserted IN_PROGRESS come back with what the dispatcher needs; PENDING
-- and FAILED rows come back with their status only, and PENDING ones notify
-- the dispatchers as in insert.sql. A key that already had a row comes back
-- not at all (ON CONFLICT DO NOTHING), whatever status was asked for it.
--
-- The claim tokens ($13) come from the caller, so that a caller whose reply
-- was lost (the statement may have committed) can run it again with the same
-- tokens and $14 true: the rows still IN_PROGRESS under a token asked for
-- now come back too ("recovered"), as if the lost reply had arrived. They
-- are read, not locked: DO UPDATE would lock every conflicting row, in key
-- order, against result writes that lock in id order. Nobody else holds a
-- token, so no other row can match; rows this statement inserts are not in
-- its snapshot, so none comes back twice. With $14 false the recovery is
-- not run at all (a one-time filter).
--
-- Keep the INSERT in step with insert.sql's; $1-$10 as there, $8 may also
-- hold IN_PROGRESS, $13 holds the claim token of each IN_PROGRESS row, and
-- on a retry the token an earlier call gave a row that is PENDING now ('' for
-- the others), $14 says this is a retry.
WITH ins AS (
    INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition,
                                 kafka_offset, kafka_key, payload, status,
                                 attempt_count, next_retry_at, claim_token,
                                 claimed_by, claimed_at, last_error)
    SELECT u.message_key, u.api_type, u.kafka_topic, u.kafka_partition,
           u.kafka_offset, u.kafka_key, u.payload, u.status,
           CASE WHEN u.status = 'IN_PROGRESS' THEN 1 ELSE 0 END,
           CASE u.status WHEN 'PENDING' THEN now()
                         WHEN 'IN_PROGRESS' THEN now() + $11::bigint * interval '1 millisecond' END,
           CASE WHEN u.status = 'IN_PROGRESS' THEN u.claim_token::uuid END,
           CASE WHEN u.status = 'IN_PROGRESS' THEN $12::text END,
           CASE WHEN u.status = 'IN_PROGRESS' THEN now() END,
           nullif(u.last_error, '')
    FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[],
                $6::bytea[], $7::bytea[], $8::text[], $9::text[], $13::text[])
         AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
              kafka_key, payload, status, last_error, claim_token)
    ON CONFLICT (message_key) DO NOTHING
    RETURNING id, message_key, status, claim_token, created_at, next_retry_at
), recovered AS (
    SELECT r.id, r.message_key, r.status, r.claim_token, r.created_at, r.next_retry_at
    FROM unnest($1::text[], $13::text[]) AS k(message_key, claim_token)
    -- LATERAL: one probe of the message_key index per claimed key, never a
    -- scan of the table, whatever plan a small table's statistics suggest.
    CROSS JOIN LATERAL (
        SELECT f.id, f.message_key, f.status, f.claim_token, f.created_at, f.next_retry_at
        FROM forward_records f
        WHERE f.message_key = k.message_key
    ) r
    WHERE $14::boolean
      AND k.claim_token <> ''
      AND r.status = 'IN_PROGRESS'
      AND r.claim_token::text = k.claim_token
), notified AS (
    SELECT pg_notify($10, '')
    FROM ins
    WHERE status = 'PENDING'
    LIMIT 1
)
SELECT id, message_key, status, claim_token::text, created_at, next_retry_at,
       (SELECT count(*) FROM notified) AS notified
FROM (SELECT * FROM ins UNION ALL SELECT * FROM recovered) AS back;
