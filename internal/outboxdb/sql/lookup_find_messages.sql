-- The rows of a search by plate, park, berth or device, or by none of
-- them, through an index of forward_messages (lookup_find.sql). The
-- driver's condition and order are pasted in the WHERE and ORDER BY
-- (lookup.go): its ORDER BY is the column order of the index it walks, so
-- that index is the only one that returns the rows already sorted. Every
-- partition has the index: PostgreSQL walks each partition's backwards
-- from the newest row and merges them (Merge Append), stopping after
-- @limit rows.
--
-- Why every filter says `x >= @x AND x <= @x` instead of `x = @x`: with an
-- equality the planner drops x from the sort order (x is constant), is left
-- with `ORDER BY id DESC`, and may then walk the primary key backwards
-- filtering x, cheap by its estimate when x is frequent, but a read of every
-- partition when x's rows are all old (a park that stopped sending); and an
-- equality beside the driver's range makes it count x's rows far too few,
-- and read and sort them all rather than merge the partitions' walks. The
-- range matches the same rows and keeps x in the order, which only x's
-- index provides.
--
-- The other filters are checked on the rows the driver yields: the status
-- on the delivery row (SUCCESS: there is none; the status given is known
-- when the statement is planned, so one branch of the condition folds away
-- and the join becomes an anti-join or an inner one, whose matches the
-- planner can count: left as an OR of both, it counts next to none and
-- plans to read every partition and sort), the errcode on the message's
-- latest attempt, in its partition.
SELECT m.id, m.created_at
FROM forward_messages m
LEFT JOIN forward_deliveries d ON d.id = m.id
WHERE /*DRIVER*/
  AND (@plate::text IS NULL OR (m.plate_no >= @plate::text AND m.plate_no <= @plate::text))
  AND (@park::text IS NULL OR (m.park_code >= @park::text AND m.park_code <= @park::text))
  AND (@berth::text IS NULL OR (m.berth_code >= @berth::text AND m.berth_code <= @berth::text))
  AND (@device::text IS NULL OR (m.device_id >= @device::text AND m.device_id <= @device::text))
  AND (@status::text IS NULL
       OR @status::text = 'SUCCESS' AND d.id IS NULL
       OR @status::text <> 'SUCCESS' AND d.status >= @status::text AND d.status <= @status::text)
  AND (@errcode::text IS NULL OR (
        SELECT e.platform_errcode
        FROM forward_retry_logs e
        WHERE e.record_id = m.id AND e.record_created_at = m.created_at
          AND e.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
        ORDER BY e.id DESC
        LIMIT 1) = @errcode::text)
  AND (@since::timestamptz IS NULL OR m.created_at >= @since::timestamptz)
  AND (@until::timestamptz IS NULL OR m.created_at < @until::timestamptz)
ORDER BY /*ORDER*/
LIMIT @limit
