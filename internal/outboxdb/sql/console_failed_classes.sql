-- FAILED rows by failure class ('' for rows from before classes existed),
-- for the console, through forward_deliveries_status_idx.
SELECT coalesce(failure_class, '') AS class, count(*) AS rows
FROM forward_deliveries
WHERE status = 'FAILED'
GROUP BY 1
ORDER BY 2 DESC, 1;
