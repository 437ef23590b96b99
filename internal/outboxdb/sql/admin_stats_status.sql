-- Rows by status, for `forwarder outbox stats`.
--
-- An exact count: an operator command reads the whole table once, which is
-- fine at the sizes retention (`outbox purge`) keeps it to. The cheap,
-- index-only gauges for dashboards are the prometheus exporter's.
-- A delivered message (SUCCESS) has no delivery row.
SELECT status, count(*) AS rows
FROM forward_deliveries
GROUP BY status
UNION ALL
SELECT 'SUCCESS', (SELECT count(*) FROM forward_messages) - (SELECT count(*) FROM forward_deliveries)
ORDER BY 1;
