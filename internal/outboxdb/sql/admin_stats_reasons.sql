-- The most frequent last_error values of FAILED rows, for
-- `forwarder outbox stats`. $1 is how many to return.
SELECT coalesce(last_error, '') AS reason, count(*) AS rows
FROM forward_deliveries
WHERE status = 'FAILED'
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT $1;
