-- The insert's lock statement (see order_lock.sql for the protocol): it
-- locks only the ordering keys of $1 that have an active row (unfinished,
-- or FAILED and blocking) or more than one record in the batch: the keys
-- whose new rows the insert may hold, behind a row that a concurrent result
-- write may be finishing, or behind a row of its own batch that a
-- concurrent inserter of the same message may be storing. A key with one
-- record and no active row needs no lock: that record becomes the head, and
-- a second inserter making another head of the key is refused by the
-- unique index (and retries).
--
-- The keys it locked are left in the transaction-local setting
-- forwarder.order_locked (their lock ids, comma-separated) for insert.sql,
-- which refuses to hold a row of a key not in it (behind an active row that
-- appeared after this statement's snapshot): that insert fails with
-- serialization_failure and is run again, and then locks the key. The shared ordering barrier is taken whenever $1 has a key, so an
-- operator's requeue (which takes it exclusively) never runs beside an
-- insert of ordered rows.
--
-- $1 the ordering keys of the batch's records, one per record ('' or NULL
-- elements are ignored).
WITH k AS (
    SELECT s.key, hashtext(s.key) AS h, count(*) > 1 AS repeated
    FROM unnest($1::text[]) AS s(key)
    WHERE s.key <> ''
    GROUP BY s.key
), barrier AS (
    SELECT pg_advisory_xact_lock_shared(1869767778, 0) AS b
    WHERE EXISTS (SELECT 1 FROM k)
), active AS (
    -- One probe of forward_deliveries_order_idx per key (LATERAL, LIMIT 1:
    -- never a hash of every active row, whatever the statistics say).
    SELECT DISTINCT k.h
    FROM k
    CROSS JOIN (SELECT count(*) FROM barrier) AS taken
    LEFT JOIN LATERAL (
        SELECT 1 AS found
        FROM forward_deliveries a
        WHERE NOT k.repeated
          AND a.ordering_key = k.key
          AND (a.status IN ('PENDING', 'IN_PROGRESS') OR a.order_blocked)
        LIMIT 1) AS act ON true
    WHERE k.repeated OR act.found IS NOT NULL
), locked AS (
    -- A sorted subquery is not flattened: the locks are taken in its order.
    SELECT o.h
    FROM (SELECT h FROM active ORDER BY h) AS o
    CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock(1869767787, o.h)) AS x
)
SELECT set_config('forwarder.order_locked', coalesce(string_agg(h::text, ','), ''), true) AS locked
FROM locked;
