-- Records the result of one attempt for a batch of claimed rows and appends one
-- forward_retry_logs row per recorded attempt: one statement, so one
-- transaction and one round trip per batch (state change and attempt log can
-- never disagree). A row that ends SUCCESS leaves forward_deliveries: its
-- delivery row is deleted (a deletion writes no index entry) and the attempt
-- log says when, by whom (the claimer), with which HTTP status and at which
-- attempt (docs/architecture.md, "Database: the data model"). The others are
-- updated in place.
--
-- Fencing: a row is written only while the caller still holds its claim, that
-- is the row still carries the caller's claim_token and is still IN_PROGRESS.
-- A holder whose lease expired and whose row was claimed again (new token), or
-- a repeated write of a result already recorded, changes nothing and leaves no
-- log row. RETURNING names the rows that were recorded, so the caller can tell
-- the lost claims apart. Repeating the statement is therefore harmless, which
-- makes it safe to retry after a connection error.
--
-- next_retry_at is computed on the database clock, as in claim.sql, so that
-- instances with skewed clocks agree on when a row is due. The claim token is
-- compared as text: a malformed token in a message matches nothing instead of
-- failing the whole batch on a cast.
--
-- A FAILED row gets its failure class ($10: TRANSIENT, REJECTED or INVALID)
-- and failed_at, which automatic compensation and requeue filters read.
-- A row whose attempt failed (counted, or undone but logged) gets the time
-- in failed_attempt_at: the message's previous failure for its next claim
-- (claim.sql). An attempt undone unlogged was never sent and keeps it.
--
-- An undone row ($9) was claimed but never sent (its lease was too short for
-- a request, the platform was known to be down, or the output was stopping):
-- it goes back to PENDING as if the claim had not happened, with
-- attempt_count back down, its last error kept and no attempt logged, like an
-- undone release (release.sql). A give-back for lack of lease ($11) is
-- bounded: it counts in lease_returns, and once a row has been given back
-- that way $12 times in a row, the next one keeps its attempt (logged), so
-- that a row is never returned unsent forever. Any recorded attempt resets
-- the count. An attempt that says nothing about the row ($13: a failed
-- probe, an unavailable reply while the platform is known to be down) is
-- undone but logged, with its error and status: it was made, it does not
-- count.
--
-- The commit need not wait for the WAL flush: a result lost in a database
-- crash leaves the row IN_PROGRESS until its lease runs out, and it is sent
-- again, which the platform answers as a duplicate (docs/architecture.md,
-- "What may commit asynchronously").
--
-- Ordering (docs/architecture.md, "Ordering"): a row with an ordering key
-- that ends SUCCESS, or FAILED with $14 = 'skip', releases the next row held
-- behind it: the held row of its key with the lowest id is promoted (no
-- longer held, due now), and the dispatchers are notified on channel $15. A
-- row released by a FAILED one gets an ORDER_RELEASED attempt log naming
-- it. With $14 = 'block' a FAILED row is marked order_blocked instead and
-- keeps holding its key until an operator requeues or releases it. The
-- caller locks the keys of the rows it finishes first (order_lock.sql, an
-- earlier statement of the same transaction), so this statement's snapshot
-- holds every row of those keys that an insert committed before.
--
-- Chained dispatch: up to $18 of the released rows are claimed here for the
-- caller's dispatcher ($16 claimer, $17 lease in milliseconds) and come
-- back (kind 'c') for it to hand over in memory, like direct dispatch: a
-- key's next row costs no claim statement and no second row version, and
-- it is sent without waiting for a notification. Should the reply be lost,
-- their lease brings them back like any claim.
--
-- $1 ids, $2 claim tokens, $3 statuses left (SUCCESS | FAILED | PENDING),
-- $4 retry delays in ms (used for PENDING), $5 HTTP statuses, $6 errors
-- (last_error and the log's error_message), $7 platform errcodes,
-- $8 request durations in ms, $9 undo flags, $10 failure classes (for
-- FAILED), $11 the undo is for lack of lease, $12 give-backs allowed in a
-- row, $13 an undone attempt is logged, $14 what a FAILED ordered row does
-- (skip | block), $15 the notification channel, $16 claimer, $17 lease in
-- milliseconds and $18 most rows for chained dispatch (0: none). $4..$8
-- and $10 may hold NULLs.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), result AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[],
                $5::integer[], $6::text[], $7::text[], $8::integer[], $9::boolean[],
                $10::text[], $11::boolean[], $13::boolean[])
        AS t(id, claim_token, status, retry_in_ms, http_status, error, errcode, duration_ms, undo,
             failure_class, for_lease, logged)
), tokens AS MATERIALIZED (
    -- Each result's claim token by row id, in one value that the fences
    -- below look a row up in (a jsonb object: a binary search). Joined to
    -- the results themselves, the rows were matched by a nested loop that
    -- read every result for every row whenever the statistics said the
    -- queue was empty: a million comparisons for a write of a thousand
    -- (docs/architecture.md, "A queue's statistics are not trusted").
    -- MATERIALIZED: computed once, not again for each row. Read as a
    -- value, (SELECT by_id FROM tokens), never joined: a join makes each
    -- row written carry a copy of the whole object, n copies of n entries.
    SELECT jsonb_object_agg(id::text, claim_token) AS by_id
    FROM result
), delivered AS (
    DELETE FROM forward_deliveries AS r
    -- One probe of the primary key per result, whatever the statistics say.
    WHERE r.id = ANY (ARRAY(SELECT id FROM result WHERE status = 'SUCCESS' AND NOT undo))
      AND r.claim_token::text = (SELECT by_id FROM tokens) ->> r.id::text
      -- IS TRUE keeps this test out of index conditions: the rows must be
      -- found by primary key, one probe per result, never by reading every
      -- IN_PROGRESS row of every instance through the status index, which
      -- the planner would pick whenever its statistics saw few of them.
      AND (r.status = 'IN_PROGRESS') IS TRUE
    RETURNING r.id, r.created_at, r.attempt_count, 'SUCCESS'::text AS status,
              NULL::timestamptz AS next_retry_at, r.ordering_key, NULL::text AS last_error,
              r.claimed_by, false AS unlogged
), outcomes AS MATERIALIZED (
    -- The results that change a row rather than delete it (a retry, a
    -- failure, a give-back), by row id, in one value looked up per row as
    -- the tokens are: never joined, whatever the statistics say.
    SELECT jsonb_object_agg(id::text, jsonb_build_object(
               'status', status, 'retry_in_ms', retry_in_ms, 'http_status', http_status,
               'error', error, 'failure_class', failure_class, 'undo', undo,
               'for_lease', for_lease, 'logged', logged)) AS by_id
    FROM result
    WHERE status <> 'SUCCESS' OR undo
), updated AS (
    UPDATE forward_deliveries AS r
    SET (status, next_retry_at, attempt_count, lease_returns, last_http_status, last_error,
         failure_class, failed_at, failed_attempt_at, order_blocked, updated_at) = (
        SELECT o.status,
               CASE WHEN o.status = 'PENDING'
                    THEN now() + coalesce(o.retry_in_ms, 0) * interval '1 millisecond'
               END,
               CASE WHEN o.undo AND NOT (o.for_lease AND r.lease_returns >= $12::integer)
                    THEN greatest(r.attempt_count - 1, 0)
                    ELSE r.attempt_count END,
               CASE WHEN NOT o.undo THEN 0
                    WHEN o.for_lease AND r.lease_returns >= $12::integer THEN 0
                    WHEN o.for_lease THEN r.lease_returns + 1
                    ELSE r.lease_returns END,
               CASE WHEN o.undo AND NOT o.logged THEN r.last_http_status
                    ELSE o.http_status END,
               CASE WHEN o.undo AND NOT o.logged
                         AND NOT (o.for_lease AND r.lease_returns >= $12::integer)
                    THEN r.last_error ELSE o.error END,
               CASE WHEN o.status = 'FAILED' THEN coalesce(o.failure_class, 'TRANSIENT') END,
               CASE WHEN o.status = 'FAILED' THEN now() ELSE r.failed_at END,
               CASE WHEN NOT o.undo OR o.logged THEN now() ELSE r.failed_attempt_at END,
               (o.status = 'FAILED' AND r.ordering_key IS NOT NULL AND $14::text = 'block'),
               now()
        FROM jsonb_to_record((SELECT by_id FROM outcomes) -> r.id::text)
            AS o(status text, retry_in_ms bigint, http_status integer, error text,
                 failure_class text, undo boolean, for_lease boolean, logged boolean))
    -- One probe of the primary key per result, as in "delivered".
    WHERE r.id = ANY (ARRAY(SELECT id FROM result WHERE status <> 'SUCCESS' OR undo))
      AND r.claim_token::text = (SELECT by_id FROM tokens) ->> r.id::text
      AND (r.status = 'IN_PROGRESS') IS TRUE
    RETURNING r.id, r.created_at, r.attempt_count, r.status, r.next_retry_at, r.ordering_key, r.last_error,
              r.claimed_by,
              -- An undo for lack of lease past the bound kept its attempt:
              -- it is logged like one. (r.lease_returns is the new value.)
              (SELECT o.undo AND NOT o.logged AND NOT (o.for_lease AND r.lease_returns = 0)
               FROM jsonb_to_record((SELECT by_id FROM outcomes) -> r.id::text)
                   AS o(undo boolean, for_lease boolean, logged boolean)) AS unlogged
), recorded AS (
    SELECT * FROM delivered
    UNION ALL
    SELECT * FROM updated
), logged AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status,
                                    platform_errcode, error_message, duration_ms, next_retry_at, attempted_by)
    SELECT recorded.id, recorded.created_at, recorded.attempt_count, recorded.status, result.http_status,
           result.errcode, result.error, result.duration_ms, recorded.next_retry_at, recorded.claimed_by
    FROM recorded
    JOIN result ON result.id = recorded.id
    WHERE NOT recorded.unlogged
), finished AS (
    -- Rows whose end releases their key; one per key (a key has one head).
    SELECT DISTINCT ON (ordering_key) id, status, ordering_key, last_error
    FROM recorded
    WHERE ordering_key IS NOT NULL
      AND (status = 'SUCCESS' OR (status = 'FAILED' AND $14::text <> 'block'))
), successor AS (
    SELECT finished.*,
           (SELECT h.id
            FROM forward_deliveries h
            WHERE h.ordering_key = finished.ordering_key
              AND coalesce(h.order_held, false)
              -- order_idx's predicate, and coalesce() so that order_held_idx does not
              -- qualify: one key's entries of order_idx, never every held row in id order.
              AND (h.status IN ('PENDING', 'IN_PROGRESS') OR h.order_blocked)
            ORDER BY h.ordering_key, h.id
            LIMIT 1) AS next_id
    FROM finished
), chained AS (
    -- The released rows, in id order; the first $18 are claimed at once for
    -- the caller's dispatcher ($16), the rest are due for any dispatcher.
    SELECT next_id AS id, row_number() OVER (ORDER BY next_id) <= $18::integer AS claim
    FROM successor
    WHERE next_id IS NOT NULL
), promoted_claimed AS (
    -- Claimed as claim.sql would: an attempt counts, a fresh token fences
    -- its result, and the lease starts now. One row version instead of a
    -- promotion and a claim.
    UPDATE forward_deliveries AS h
    SET order_held    = false,
        status        = 'IN_PROGRESS',
        attempt_count = h.attempt_count + 1,
        next_retry_at = now() + $17::bigint * interval '1 millisecond',
        claim_token   = gen_random_uuid(),
        claimed_by    = $16::text,
        claimed_at    = now(),
        updated_at    = now()
    -- = ANY(ARRAY(...)) as in claim.sql: the rows are read through the
    -- primary key, one probe each, never by hashing every held row.
    WHERE h.id = ANY (ARRAY(SELECT id FROM chained WHERE claim))
      AND h.order_held
    RETURNING h.id, h.created_at, h.attempt_count, h.claim_token, h.next_retry_at
), promoted_due AS (
    UPDATE forward_deliveries AS h
    SET order_held    = false,
        next_retry_at = now(),
        updated_at    = now()
    WHERE h.id = ANY (ARRAY(SELECT id FROM chained WHERE NOT claim))
      AND h.order_held
    RETURNING h.id, h.created_at, h.attempt_count
), promoted AS (
    SELECT id, created_at, attempt_count - 1 AS attempt_count FROM promoted_claimed
    UNION ALL
    SELECT id, created_at, attempt_count FROM promoted_due
), released AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT p.id, p.created_at, p.attempt_count, 'ORDER_RELEASED',
           left('released by on_failed skip: row ' || s.id || ', earlier in the ordering key, ended FAILED: '
                || coalesce(s.last_error, 'no error recorded'), 1024),
           now()
    FROM promoted p
    JOIN successor s ON s.next_id = p.id
    WHERE s.status = 'FAILED'
), notified AS (
    -- Rows claimed here go to the caller's dispatcher; the others are due for
    -- any.
    SELECT pg_notify($15::text, 'released')
    WHERE EXISTS (SELECT 1 FROM promoted_due)
)
-- The recorded ids (kind 'r'), then the rows claimed for the caller (kind
-- 'c'), with their message read by (id, created_at).
SELECT 'r' AS kind, recorded.id, ''::text AS message_key, ''::text AS api_type, ''::text AS kafka_topic,
       0 AS kafka_partition, 0::bigint AS kafka_offset, NULL::bytea AS kafka_key, NULL::bytea AS payload,
       0 AS attempt_count, ''::text AS claim_token, recorded.created_at, NULL::timestamptz AS next_retry_at
FROM recorded, async, (SELECT count(*) FROM notified) AS n
WHERE async.done = 'off'
UNION ALL
SELECT 'c', m.id, m.message_key, m.api_type, m.kafka_topic, m.kafka_partition, m.kafka_offset, m.kafka_key,
       m.payload, c.attempt_count, c.claim_token::text, m.created_at, c.next_retry_at
FROM promoted_claimed c
JOIN forward_messages m ON m.id = c.id AND m.created_at = c.created_at;
