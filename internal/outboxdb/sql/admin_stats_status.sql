-- Rows by status, for `forwarder outbox stats`.
--
-- An exact count: an operator command reads the whole table once, which is
-- fine at the sizes retention (`outbox purge`) keeps it to. The cheap,
-- index-only gauges for dashboards are the prometheus exporter's.
SELECT status, count(*) AS rows
FROM forward_records
GROUP BY status;
