-- Persists one batch of Kafka messages as new outbox rows, in one statement.
--
-- The batch arrives as parallel arrays, one element per row, so the statement
-- text and its prepared plan stay the same whatever the batch size. Each new
-- message gets its id, its delivery row (forward_deliveries) and its
-- immutable message (forward_messages, in the partition of now()).
--
-- A redelivered message is a no-op, whatever state its row is in
-- (docs/architecture.md, "Dedupe across partitions"): a key stored in any
-- partition is found by one `message_key = ANY(...)` scan per partition
-- ("stored"), and a key whose row another transaction is inserting right now
-- meets it in the unique index of forward_deliveries.message_key, which ON
-- CONFLICT DO NOTHING waits for and skips. (A message another transaction
-- stored and delivered while this statement ran is caught by the statement
-- that follows it, insert_backstop.sql.) The caller removes duplicate keys
-- from the arrays first and orders them by key, so that concurrent inserters
-- meet overlapping keys in the same order and cannot deadlock on each
-- other's speculative insertions.
--
-- A row asked for as PENDING is due at once (next_retry_at = now()); a FAILED
-- one is finished (next_retry_at NULL, failure class INVALID: it is never
-- sent). A row asked for as IN_PROGRESS is inserted already claimed by $18
-- for a lease of $17 milliseconds, with attempt 1 and the claim token given
-- in $10, exactly as claim.sql would leave it: direct dispatch hands it to
-- the dispatcher of the inserting process in memory, which saves the NOTIFY,
-- the claim statement and a second version of the row. Should the process
-- die before a result is written, the lease brings the row back like any
-- other claim.
--
-- The NOTIFY runs in the same statement, hence the same transaction: it is
-- delivered when the rows are committed and never for rows that were not,
-- and only when a row is PENDING, so duplicates and bad messages do not wake
-- the dispatchers. pg_notify is volatile, so the "notified" CTE is not
-- inlined; the summary row makes sure it runs once.
--
-- The claim tokens come from the caller, so that a caller whose reply was
-- lost (the statement may have committed) can run it again with the same
-- tokens and $19 true: the rows still IN_PROGRESS under a token asked for now
-- come back too ("recovered"), as if the lost reply had arrived. They are
-- read, not locked: DO UPDATE would lock every conflicting row, in key order,
-- against result writes that lock in id order. Nobody else holds a token, so
-- no other row can match; rows this statement inserts are not in its
-- snapshot, so none comes back twice. With $19 false the recovery is not run
-- at all (a one-time filter).
--
-- Ordering (docs/architecture.md, "Ordering"): a PENDING row with an
-- ordering key ($15) is inserted held (order_held, not due, left out of
-- forward_deliveries_due_idx) while its key has an active row, unfinished or a
-- FAILED row blocking it, or when an earlier record of this batch (lower
-- position, hence lower id: the caller lays a key's records out in batch
-- order) has the same key and is new. "New" means its message_key is not
-- stored yet; under the key lock no other transaction can be inserting it,
-- and this statement's snapshot sees every row of the key committed before.
-- The caller locks, in an earlier statement of this transaction
-- (order_lock_active.sql), the keys that have an active row or several
-- records here: the keys whose rows may be held. A row that would be held
-- behind a key it did not lock (an active row appeared since) fails the
-- statement with serialization_failure, and the caller runs it again. A
-- held row asked for as IN_PROGRESS is inserted PENDING and held instead,
-- and does not come back claimed: direct dispatch only hands over heads.
-- FAILED rows are never ordered. Rows are inserted in the arrays' order
-- (ORDER BY n), so their ids follow it.
--
-- What comes back: the claimed rows (inserted or recovered), and last one
-- summary row (status '') counting the
-- PENDING and FAILED rows inserted. Rows whose key already existed do not
-- come back: RETURNING sees only the rows this statement inserted.
--
-- $1 message_key, $2 api_type, $3 kafka_topic, $4 kafka_partition,
-- $5 kafka_offset, $6 kafka_key (NULL elements for no key), $7 payload,
-- $8 status (PENDING, FAILED or IN_PROGRESS), $9 last_error ('' for none),
-- $10 claim token of an IN_PROGRESS row, or on a retry the token an earlier
-- call gave a row that is PENDING now ('' for the others), $11 plate_no,
-- $12 park_code, $13 berth_code, $14 device_id ('' for none), $15 ordering
-- key ('' for none), $16 the notification channel, $17 lease in
-- milliseconds, $18 claimer, $19 this is a retry, $20 the W3C traceparent
-- of the span that inserts the message ('' for none: stored NULL; see
-- docs/operations.md, "Tracing").
WITH batch AS (
    SELECT u.*,
           CASE WHEN u.status <> 'FAILED' THEN nullif(u.ordering_key, '') END AS okey
    FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[],
                $6::bytea[], $7::bytea[], $8::text[], $9::text[], $10::text[],
                $11::text[], $12::text[], $13::text[], $14::text[], $15::text[],
                $20::text[])
         WITH ORDINALITY
         AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
              kafka_key, payload, status, last_error, claim_token,
              plate_no, park_code, berth_code, device_id, ordering_key, trace_parent, n)
), stored AS MATERIALIZED (
    -- The keys some partition already holds: one index scan of each
    -- partition's forward_messages_key_idx for the whole batch.
    SELECT DISTINCT m.message_key
    FROM forward_messages m
    WHERE m.message_key = ANY ($1::text[])
), locks AS MATERIALIZED (
    -- The lock ids order_lock_active.sql took, parsed once.
    SELECT coalesce(string_to_array(nullif(current_setting('forwarder.order_locked', true), ''), ',')::integer[],
                    '{}') AS hs
), planned AS (
    -- The active-row probe is a LATERAL subquery with LIMIT 1, so that each
    -- ordered record costs one probe of forward_deliveries_order_idx
    -- whatever the statistics say: as a plain EXISTS test the planner may
    -- hash every unfinished row instead.
    SELECT f.*,
           f.okey IS NOT NULL AND (
               active.found IS NOT NULL
               OR coalesce(bool_or(f.new_ordered) OVER (
                      PARTITION BY f.okey ORDER BY f.n
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false)
           ) AS held,
           -- Held behind a row of a key this transaction did not lock
           -- (order_lock_active.sql): an active row appeared since; start
           -- again.
           CASE WHEN (active.found IS NOT NULL
                      OR bool_or(f.new_ordered) OVER (
                             PARTITION BY f.okey ORDER BY f.n
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
                     AND NOT hashtext(f.okey) = ANY (locks.hs)
                THEN forward_records_order_conflict(f.okey)
                ELSE false END AS conflict
    FROM (SELECT b.*, b.okey IS NOT NULL AND NOT b.is_stored AS new_ordered
          FROM (SELECT batch.*, batch.message_key IN (SELECT message_key FROM stored) AS is_stored
                FROM batch) AS b) AS f
    LEFT JOIN LATERAL (
        SELECT 1 AS found
        FROM forward_deliveries a
        WHERE f.okey IS NOT NULL
          AND a.ordering_key = f.okey
          AND (a.status IN ('PENDING', 'IN_PROGRESS') OR a.order_blocked)
        LIMIT 1) AS active ON true
    CROSS JOIN locks
), fresh AS (
    -- The records to store, with their ids drawn in batch order (a key's
    -- rows are delivered in id order) and st, the status each gets: PENDING
    -- for a held row asked IN_PROGRESS.
    SELECT p.*, nextval('forward_messages_id_seq') AS id,
           CASE WHEN p.held THEN 'PENDING' ELSE p.status END AS st
    FROM (SELECT * FROM planned WHERE NOT conflict AND NOT is_stored ORDER BY n) AS p
), ins AS (
    INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, next_retry_at,
                                    payload_size, claim_token, claimed_by, claimed_at, last_error,
                                    failure_class, failed_at, ordering_key, order_held)
    SELECT p.id, now(), p.message_key, p.st,
           CASE WHEN p.st = 'IN_PROGRESS' THEN 1 ELSE 0 END,
           CASE p.st WHEN 'PENDING' THEN now()
                     WHEN 'IN_PROGRESS' THEN now() + $17::bigint * interval '1 millisecond' END,
           octet_length(p.payload),
           CASE WHEN p.st = 'IN_PROGRESS' THEN p.claim_token::uuid END,
           CASE WHEN p.st = 'IN_PROGRESS' THEN $18::text END,
           CASE WHEN p.st = 'IN_PROGRESS' THEN now() END,
           nullif(p.last_error, ''),
           CASE WHEN p.st = 'FAILED' THEN 'INVALID' END,
           CASE WHEN p.st = 'FAILED' THEN now() END,
           p.okey, p.held
    FROM fresh AS p
    ORDER BY p.n
    ON CONFLICT (message_key) DO NOTHING
    RETURNING id, message_key, status, claim_token, created_at, next_retry_at, order_held
), messages AS (
    INSERT INTO forward_messages (id, created_at, message_key, api_type, kafka_topic, kafka_partition,
                                  kafka_offset, kafka_key, payload, plate_no, park_code, berth_code, device_id,
                                  trace_parent)
    SELECT p.id, now(), p.message_key, p.api_type, p.kafka_topic, p.kafka_partition,
           p.kafka_offset, p.kafka_key, p.payload,
           nullif(p.plate_no, ''), nullif(p.park_code, ''), nullif(p.berth_code, ''),
           nullif(p.device_id, ''), nullif(p.trace_parent, '')
    FROM fresh AS p
    WHERE p.id IN (SELECT id FROM ins)
    ORDER BY p.n
    RETURNING id
), recovered AS (
    SELECT r.id, r.message_key, r.status, r.claim_token, r.created_at, r.next_retry_at
    FROM unnest($1::text[], $10::text[]) AS k(message_key, claim_token)
    -- LATERAL: one probe of the message_key index per claimed key, never a
    -- scan of the table, whatever plan a small table's statistics suggest.
    CROSS JOIN LATERAL (
        SELECT d.id, d.message_key, d.status, d.claim_token, d.created_at, d.next_retry_at
        FROM forward_deliveries d
        WHERE d.message_key = k.message_key
        -- OFFSET 0 keeps the subquery from being flattened into a join,
        -- which statistics taken while the queue looked empty planned as a
        -- walk of the whole index, or as a reread of the keys for each row
        -- (docs/architecture.md, "A queue's statistics are not trusted").
        OFFSET 0
    ) r
    WHERE $19::boolean
      AND k.claim_token <> ''
      AND r.status = 'IN_PROGRESS'
      AND r.claim_token::text = k.claim_token
), notified AS (
    SELECT pg_notify($16, '')
    FROM ins
    WHERE status = 'PENDING' AND NOT order_held
    LIMIT 1
)
SELECT id, message_key, status, claim_token::text, created_at, next_retry_at,
       NULL::bigint AS pending, NULL::bigint AS failed
FROM ins
WHERE status = 'IN_PROGRESS'
UNION ALL
SELECT id, message_key, status, claim_token::text, created_at, next_retry_at, NULL, NULL
FROM recovered
UNION ALL
SELECT NULL, NULL, '', NULL, NULL, NULL,
       (SELECT count(*) FROM ins WHERE status = 'PENDING'),
       (SELECT count(*) FROM ins WHERE status = 'FAILED')
FROM (SELECT count(*) FROM notified) AS n, (SELECT count(*) FROM messages) AS m;
