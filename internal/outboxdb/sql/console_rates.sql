-- Recent rates for the console overview, over the last minute and the last
-- ten: rows persisted (created_at, through forward_records_created_at_idx)
-- and attempts by outcome (forward_retry_logs, newest first by its primary
-- key: attempt logs are appended in time order). Each side reads at most $1
-- rows, so the cost is bounded at any rate; when a side reached its cap
-- before the ten minutes, its ten-minute figures are lower bounds (the
-- *_capped columns say so).
WITH created AS (
    SELECT created_at
    FROM forward_records
    WHERE created_at >= now() - interval '10 minutes'
    ORDER BY created_at DESC
    LIMIT $1
), attempts AS (
    SELECT attempted_at, result_status
    FROM forward_retry_logs
    ORDER BY id DESC
    LIMIT $1
)
SELECT (SELECT count(*) FROM created WHERE created_at >= now() - interval '1 minute') AS created_1m,
       (SELECT count(*) FROM created) AS created_10m,
       (SELECT count(*) FROM created) >= $1 AS created_capped,
       count(*) FILTER (WHERE result_status = 'SUCCESS' AND attempted_at >= now() - interval '1 minute') AS delivered_1m,
       count(*) FILTER (WHERE result_status = 'SUCCESS' AND attempted_at >= now() - interval '10 minutes') AS delivered_10m,
       count(*) FILTER (WHERE result_status IN ('PENDING', 'FAILED') AND attempted_at >= now() - interval '1 minute') AS failed_1m,
       count(*) FILTER (WHERE result_status IN ('PENDING', 'FAILED') AND attempted_at >= now() - interval '10 minutes') AS failed_10m,
       count(*) >= $1 AND min(attempted_at) >= now() - interval '10 minutes' AS attempts_capped
FROM attempts;
