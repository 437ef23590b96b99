-- The console overview's shared state: the platform breaker (one row in
-- forward_platform_state; none only on a schema that was never migrated
-- fully), and the ordering state: rows held behind an earlier row of their
-- key (forward_deliveries_order_held_idx) and keys blocked by a FAILED row
-- (forward_deliveries_order_blocked_idx), both exact counts over partial
-- indexes that hold only those rows. The operator's pause of delivery
-- (migration 0006): the latest one, and whether it is in force.
SELECT s.breaker_state, s.changed_at, s.changed_by, s.reason, s.next_probe_at, s.paused_until,
       s.pause_since, s.pause_until, coalesce(s.pause_by, ''), coalesce(s.pause_reason, ''),
       coalesce(s.pause_since IS NOT NULL AND (s.pause_until IS NULL OR s.pause_until > now()), false),
       (SELECT count(*) FROM forward_deliveries WHERE order_held) AS held_rows,
       (SELECT count(DISTINCT ordering_key) FROM forward_deliveries WHERE order_blocked) AS blocked_keys,
       now() AS db_now
FROM (SELECT 1) AS one
LEFT JOIN forward_platform_state s ON true;
