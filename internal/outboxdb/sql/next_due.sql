-- Milliseconds until the next unfinished row falls due (negative when one is
-- due already but locked by someone else), or no row when none is unfinished.
-- Lease deadlines of IN_PROGRESS rows count too: that is when an abandoned
-- claim can be rescued. Reads the first entry of forward_deliveries_due_idx.
SELECT floor(extract(epoch FROM (next_retry_at - now())) * 1000)::bigint AS due_in_ms
FROM forward_deliveries
WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
ORDER BY next_retry_at, id
LIMIT 1;
