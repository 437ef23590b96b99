-- The record gauges of the prometheus exporter, read by one background
-- refresher per instance (never per scrape). Nothing here reads SUCCESS rows,
-- so the cost does not grow with the number of finished rows:
--
-- * PENDING, IN_PROGRESS and FAILED are exact counts through
--   forward_deliveries_status_idx: forward_deliveries holds those rows only
--   (a delivered message has none), so the cost grows with the backlog and
--   the FAILED rows only.
-- * The oldest due row is the first entry of forward_deliveries_due_idx, the
--   same index walk the claim starts with: one index probe.
-- * Ordering: rows held behind an earlier row of their key (counted through
--   forward_deliveries_order_held_idx), keys blocked by a FAILED row (through
--   forward_deliveries_order_blocked_idx), how long the held row with the
--   lowest id has been held (since it was inserted or requeued: its
--   updated_at), one probe of the held index, and how long the longest
--   blocked key has been blocked (the blocked rows are few). Held rows are
--   PENDING and count in pending as well.
-- * SUCCESS is derived in Go (gauges.go) from the live-row count of the
--   statistics system or the planner's size estimate, minus the exact
--   unfinished counts; the inputs come from pg_class and pg_stat functions,
--   which read no table rows. Small tables are counted exactly instead
--   (gauges_success_exact.sql).
WITH parts AS (
    -- The message partitions: every message is a live row of one of them.
    SELECT pg_stat_get_live_tuples(c.oid) AS live,
           -- Live-row statistics are discarded by a crash or pg_stat_reset()
           -- and restart from zero; they are a full count again once the
           -- partition has been vacuumed or analysed since. reltuples < 0:
           -- never vacuumed or analysed, so the statistics have seen every
           -- row since it was created.
           (c.reltuples < 0
            OR pg_stat_get_last_vacuum_time(c.oid) IS NOT NULL
            OR pg_stat_get_last_autovacuum_time(c.oid) IS NOT NULL
            OR pg_stat_get_last_analyze_time(c.oid) IS NOT NULL
            OR pg_stat_get_last_autoanalyze_time(c.oid) IS NOT NULL) AS complete,
           c.reltuples::float8 AS reltuples,
           c.relpages::bigint AS relpages,
           (pg_relation_size(c.oid) / current_setting('block_size')::bigint) AS pages
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'forward_messages'::regclass
)
SELECT u.pending,
       u.in_progress,
       u.failed,
       -- Seconds the earliest-due row has been due; 0 when nothing is due yet.
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT next_retry_at
           FROM forward_deliveries
           WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
           ORDER BY next_retry_at
           LIMIT 1)), 0), 0)::float8                               AS oldest_due_age_seconds,
       (SELECT count(*) FROM forward_deliveries WHERE order_held)  AS order_held,
       (SELECT count(DISTINCT ordering_key)
        FROM forward_deliveries WHERE order_blocked)               AS order_blocked_keys,
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT updated_at
           FROM forward_deliveries
           WHERE order_held
           ORDER BY id
           LIMIT 1)), 0), 0)::float8                               AS oldest_held_age_seconds,
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT min(failed_at)
           FROM forward_deliveries
           WHERE order_blocked)), 0), 0)::float8                   AS oldest_blocked_age_seconds,
       coalesce((SELECT sum(live) FROM parts), 0)::bigint           AS live_tuples,
       coalesce((SELECT bool_and(complete) FROM parts), true)       AS live_tuples_complete,
       -- The planner's estimate, partition by partition, where the
       -- statistics are not complete.
       coalesce((SELECT sum(CASE WHEN complete OR relpages = 0 OR reltuples < 0 THEN live
                                 ELSE reltuples / relpages * pages END) FROM parts), 0)::float8 AS estimate,
       coalesce((SELECT sum(pages) FROM parts), 0)::bigint          AS pages,
       now()                                                        AS taken_at
FROM (
    SELECT count(*) FILTER (WHERE status = 'PENDING')     AS pending,
           count(*) FILTER (WHERE status = 'IN_PROGRESS') AS in_progress,
           count(*) FILTER (WHERE status = 'FAILED')      AS failed
    FROM forward_deliveries
) u;
