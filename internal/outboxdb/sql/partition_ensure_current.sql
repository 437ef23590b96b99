-- Creates the partition the current time falls in, and the next, for an
-- insert that found none: as wide as the newest partition (the width the
-- dispatchers keep ahead), a day when there is none.
SELECT forward_partition_ensure(now(), now() + w, w)
FROM (SELECT coalesce((SELECT p.upper - p.lower FROM forward_partitions p ORDER BY p.lower DESC LIMIT 1),
                      interval '1 day') AS w) AS p;
