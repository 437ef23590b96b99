-- The record gauges of the prometheus exporter, read by one background
-- refresher per instance (never per scrape). Nothing here reads SUCCESS rows,
-- so the cost does not grow with the number of finished rows:
--
-- * PENDING, IN_PROGRESS and FAILED are exact counts through the partial
--   index forward_records_unfinished_status_idx (WHERE status <> 'SUCCESS');
--   the cost grows with the backlog and the FAILED rows only.
-- * The oldest due row is the first entry of forward_records_due_idx, the
--   same index walk the claim starts with: one index probe.
-- * Ordering: rows held behind an earlier row of their key (counted through
--   forward_records_order_held_idx), keys blocked by a FAILED row (through
--   forward_records_order_blocked_idx), how long the held row with the
--   lowest id has been held (since it was inserted or requeued: its
--   updated_at), one probe of the held index, and how long the longest
--   blocked key has been blocked (the blocked rows are few). Held rows are
--   PENDING and count in pending as well.
-- * SUCCESS is derived in Go (gauges.go) from the live-row count of the
--   statistics system or the planner's size estimate, minus the exact
--   unfinished counts; the inputs come from pg_class and pg_stat functions,
--   which read no table rows. Small tables are counted exactly instead
--   (gauges_success_exact.sql).
SELECT u.pending,
       u.in_progress,
       u.failed,
       -- Seconds the earliest-due row has been due; 0 when nothing is due yet.
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT next_retry_at
           FROM forward_records
           WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
           ORDER BY next_retry_at
           LIMIT 1)), 0), 0)::float8                            AS oldest_due_age_seconds,
       (SELECT count(*) FROM forward_records WHERE order_held)  AS order_held,
       (SELECT count(DISTINCT ordering_key)
        FROM forward_records WHERE order_blocked)               AS order_blocked_keys,
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT updated_at
           FROM forward_records
           WHERE order_held
           ORDER BY id
           LIMIT 1)), 0), 0)::float8                            AS oldest_held_age_seconds,
       coalesce(greatest(extract(epoch FROM now() - (
           SELECT min(failed_at)
           FROM forward_records
           WHERE order_blocked)), 0), 0)::float8                AS oldest_blocked_age_seconds,
       pg_stat_get_live_tuples(c.oid)                           AS live_tuples,
       -- Live-row statistics are discarded by a crash or pg_stat_reset() and
       -- restart from zero; they are a full count again once the table has
       -- been vacuumed or analysed since. reltuples < 0: never vacuumed or
       -- analysed, so the statistics have seen every row since creation.
       (c.reltuples < 0
        OR pg_stat_get_last_vacuum_time(c.oid) IS NOT NULL
        OR pg_stat_get_last_autovacuum_time(c.oid) IS NOT NULL
        OR pg_stat_get_last_analyze_time(c.oid) IS NOT NULL
        OR pg_stat_get_last_autoanalyze_time(c.oid) IS NOT NULL) AS live_tuples_complete,
       c.reltuples::float8                                      AS reltuples,
       c.relpages::bigint                                       AS relpages,
       (pg_relation_size(c.oid) / current_setting('block_size')::bigint) AS pages,
       now()                                                    AS taken_at
FROM (
    SELECT count(*) FILTER (WHERE status = 'PENDING')     AS pending,
           count(*) FILTER (WHERE status = 'IN_PROGRESS') AS in_progress,
           count(*) FILTER (WHERE status = 'FAILED')      AS failed
    FROM forward_records
    WHERE status <> 'SUCCESS'
) u, pg_class c
WHERE c.oid = 'forward_records'::regclass;
