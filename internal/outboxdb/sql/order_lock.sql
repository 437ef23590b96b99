-- Serialises the statements that change which rows of an ordering key hold
-- it: an insert (a new row is the head or held), a result write that
-- finishes a head (the next row is promoted), an operator's release, the
-- ordering repair. Each takes, before its own statement and in the same
-- transaction, an exclusive transaction-scoped advisory lock per distinct
-- key, so two of them touching one key run one after the other, and the
-- second one's statement sees what the first committed
-- (docs/architecture.md, "Ordering").
--
-- It must be its own statement, earlier in the transaction: in READ
-- COMMITTED a statement reads the snapshot taken when it started, so a lock
-- taken inside the statement that reads the key's rows would not make it
-- see the rows committed by the transaction it waited for. Callers send it
-- with the work statement in one pipeline (pgx.Batch: one round trip, one
-- implicit transaction).
--
-- Locks are taken in the order of their lock ids (the keys' hashes), the
-- same in every transaction, so that two transactions never wait for each
-- other in a cycle. Two keys with the same hash share a lock, which only
-- serialises them a little more.
--
-- Before the key locks it takes the ordering barrier in shared mode: an
-- operator's requeue (admin_requeue.sql), which picks rows by filters and so
-- cannot know their keys beforehand, takes the barrier exclusively instead,
-- and runs while no transaction holds a key lock. Nothing is locked when no
-- row is ordered.
--
-- Lock ids: (1869767778, 0) the barrier, (1869767787, hashtext(key)) a key
-- ('ordb' and 'ordk' as 32-bit integers). Session-level advisory locks with
-- a bigint key (the migration and retention locks) never conflict with them.
--
-- $1 ordering keys ('' or NULL elements are ignored), $2 ids of rows whose
-- ordering keys are locked too.
WITH k AS (
    SELECT DISTINCT hashtext(s.key) AS h
    FROM (SELECT unnest($1::text[]) AS key
          UNION ALL
          SELECT f.ordering_key
          FROM forward_deliveries f
          WHERE f.id = ANY ($2::bigint[]) AND f.ordering_key IS NOT NULL) AS s
    WHERE s.key <> ''
)
SELECT count(*) AS locks
FROM (
    SELECT pg_advisory_xact_lock_shared(1869767778, 0)
    WHERE EXISTS (SELECT 1 FROM k)
    UNION ALL
    -- A sorted subquery is not flattened: the locks are taken in its order.
    SELECT pg_advisory_xact_lock(1869767787, o.h)
    FROM (SELECT h FROM k ORDER BY h) AS o
) AS l;
