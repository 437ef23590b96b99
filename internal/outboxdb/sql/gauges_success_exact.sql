-- Exact SUCCESS count for the record gauges, run only while the table is small
-- (a few MiB of heap, see GaugeOptions.ExactSuccessMaxPages), where a scan
-- costs less than an estimate is worth.
-- A delivered message has no delivery row.
SELECT (SELECT count(*) FROM forward_messages) - (SELECT count(*) FROM forward_deliveries);
