-- Counts the rows created after id $1 by status, for the dev stack's progress
-- line (one run's rows: ids grow with insertion). A range scan of the primary
-- key: cheap for a dev run's few hundred thousand rows, not meant for
-- production dashboards (the prometheus exporter's gauges are).
SELECT count(*) AS persisted,
       count(*) FILTER (WHERE d.status = 'PENDING' AND d.attempt_count = 0) AS waiting,
       count(*) FILTER (WHERE d.status = 'PENDING' AND d.attempt_count > 0) AS retrying,
       count(*) FILTER (WHERE d.status = 'IN_PROGRESS') AS in_progress,
       count(*) FILTER (WHERE d.id IS NULL) AS delivered,
       count(*) FILTER (WHERE d.status = 'FAILED') AS failed
FROM forward_messages m
LEFT JOIN forward_deliveries d ON d.id = m.id
WHERE m.id > $1;
