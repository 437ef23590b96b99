-- Every partition of messages and attempts, oldest first.
SELECT p.lower, p.upper, p.messages, p.retry_logs
FROM forward_partitions p
ORDER BY p.lower;
