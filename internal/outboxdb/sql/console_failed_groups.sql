-- FAILED rows grouped by failure class and reason, largest group first, for
-- the console. The reason is last_error normalised so that rows failing for
-- the same reason fall in one group: UUIDs become <uuid>, runs of five or
-- more digits <n> (keys, ids, timestamps; errcodes and field values such as
-- "inoutType 7" are shorter and stay), cut to 200 characters. The same
-- expression selects a group's rows in admin_requeue.sql and
-- admin_requeue_count.sql (the console requeues a group by it; a test
-- checks that the counts agree). Reads the $2 most recently failed rows
-- through forward_deliveries_status_idx, so the cost is bounded
-- when a bad mapping fails millions of rows; past $2 FAILED rows the counts
-- describe the latest $2 (the console says so, and a group's requeue page
-- counts all its rows). $1 how many groups, $2 how many rows to read.
SELECT coalesce(r.failure_class, '') AS class,
       left(regexp_replace(regexp_replace(coalesce(r.last_error, ''),
            '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
            '[0-9]{5,}', '<n>', 'g'), 200) AS reason,
       count(*) AS rows,
       max(r.updated_at) AS last_failed_at,
       max(r.id) AS newest_id
FROM (
    SELECT failure_class, last_error, updated_at, id
    FROM forward_deliveries
    WHERE status = 'FAILED'
    ORDER BY updated_at DESC
    LIMIT $2
) r
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2
LIMIT $1;
