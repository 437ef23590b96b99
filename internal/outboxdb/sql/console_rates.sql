-- Recent rates for the console overview, over the last minute and the last
-- ten: messages persisted and attempts by outcome. Each side reads at most
-- $1 rows, so the cost is bounded at any rate; when a side reached its cap
-- before the ten minutes, its ten-minute figures are lower bounds (the
-- *_capped columns say so).
--
-- Messages: there is no index on created_at alone, but ids are handed out
-- in creation order, so the last ten minutes are among the newest $1 ids:
-- a range of the primary key (id, created_at), in the partitions that the
-- ten minutes touch. Whether the range cut the ten minutes short is told by
-- the message just below it. Attempts: the newest $1 logs by their primary
-- key (attempt logs are appended in time order).
WITH newest AS (
    SELECT id
    FROM forward_messages
    ORDER BY id DESC
    LIMIT 1
), created AS (
    SELECT m.created_at
    FROM forward_messages m
    WHERE m.id > (SELECT id FROM newest) - $1
      AND m.created_at >= now() - interval '10 minutes'
), attempts AS (
    SELECT attempted_at, result_status
    FROM forward_retry_logs
    ORDER BY id DESC
    LIMIT $1
)
SELECT (SELECT count(*) FROM created WHERE created_at >= now() - interval '1 minute') AS created_1m,
       (SELECT count(*) FROM created) AS created_10m,
       coalesce((SELECT m.created_at >= now() - interval '10 minutes'
                 FROM forward_messages m
                 WHERE m.id <= (SELECT id FROM newest) - $1
                 ORDER BY m.id DESC
                 LIMIT 1), false) AS created_capped,
       count(*) FILTER (WHERE result_status = 'SUCCESS' AND attempted_at >= now() - interval '1 minute') AS delivered_1m,
       count(*) FILTER (WHERE result_status = 'SUCCESS' AND attempted_at >= now() - interval '10 minutes') AS delivered_10m,
       count(*) FILTER (WHERE result_status IN ('PENDING', 'FAILED') AND attempted_at >= now() - interval '1 minute') AS failed_1m,
       count(*) FILTER (WHERE result_status IN ('PENDING', 'FAILED') AND attempted_at >= now() - interval '10 minutes') AS failed_10m,
       count(*) >= $1 AND min(attempted_at) >= now() - interval '10 minutes' AS attempts_capped
FROM attempts;
