-- The partitions `forwarder outbox purge` and retention may retire: those
-- whose range ended before the cutoff $1, oldest first, each with its
-- delivery rows by kind (what keeps it, docs/architecture.md "Retention")
-- and, when $2, its message count (a scan of the partition's primary key:
-- for dry runs). forward_partition_retire checks again under its lock.
--
-- A partition's delivery rows are found through the primary key of
-- forward_deliveries: their ids are those of its messages, between the
-- smallest and the largest (two probes of the partition's primary key).
-- The unfinished rows of other days are never read.
--
-- $1 cutoff, $2 count the messages.
SELECT p.lower AS range_lower,
       p.upper AS range_upper,
       CASE WHEN $2::boolean
            THEN (SELECT count(*) FROM forward_messages m WHERE m.created_at >= p.lower AND m.created_at < p.upper)
            ELSE 0 END AS message_count,
       d.failed_count,
       d.pending_count,
       d.in_progress_count,
       d.blocked_count,
       d.unpublished_count
FROM forward_partitions p
CROSS JOIN LATERAL (
    SELECT (SELECT m.id FROM forward_messages m
            WHERE m.created_at >= p.lower AND m.created_at < p.upper
            ORDER BY m.id LIMIT 1) AS lo,
           (SELECT m.id FROM forward_messages m
            WHERE m.created_at >= p.lower AND m.created_at < p.upper
            ORDER BY m.id DESC LIMIT 1) AS hi
) AS ids
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE d.status = 'FAILED')                               AS failed_count,
           count(*) FILTER (WHERE d.status = 'PENDING')                              AS pending_count,
           count(*) FILTER (WHERE d.status = 'IN_PROGRESS')                          AS in_progress_count,
           count(*) FILTER (WHERE d.order_blocked)                                   AS blocked_count,
           count(*) FILTER (WHERE d.status = 'FAILED' AND d.dead_lettered_at IS NULL) AS unpublished_count
    FROM forward_deliveries d
    WHERE d.id BETWEEN ids.lo AND ids.hi
      AND d.created_at >= p.lower AND d.created_at < p.upper
) AS d
WHERE p.upper <= $1::timestamptz
ORDER BY p.lower;
