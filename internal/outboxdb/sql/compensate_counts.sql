-- Rows FAILED on transient errors that automatic compensation will still
-- requeue ($1 rounds), and the frozen ones it is done with. Reads only
-- forward_deliveries_compensation_idx.
SELECT count(*) FILTER (WHERE requeue_rounds < $1::integer) AS waiting,
       count(*) FILTER (WHERE requeue_rounds >= $1::integer) AS frozen
FROM forward_deliveries
WHERE status = 'FAILED' AND failure_class = 'TRANSIENT';
