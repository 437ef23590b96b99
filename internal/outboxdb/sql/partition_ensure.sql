-- Creates the partitions of messages and attempts, $1 microseconds wide,
-- that cover the current time and the $2 widths after it, where none exist
-- (forward_partition_ensure, migration 0005); returns how many it created.
--
-- $1 width in microseconds, $2 partitions ahead.
SELECT forward_partition_ensure(now(), now() + $2::integer * w, w)
FROM (SELECT $1::bigint * interval '1 microsecond' AS w) AS p;
