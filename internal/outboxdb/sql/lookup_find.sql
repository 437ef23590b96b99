-- Finds rows for `forwarder outbox find` and the console's search, newest
-- first, LIMIT $9. Never a scan of forward_records: lookup.go picks one
-- "driver" per search, the most selective filter given, and pastes its
-- FROM, WHERE and ORDER BY fragments at the three markers below (the
-- fragments are constants; values stay parameters).
-- The driver's ORDER BY is the column order of the index it walks, so that
-- index is the only one that returns the rows already sorted and the walk
-- stops after $9 rows: a plate search reads forward_records_plate_idx
-- backwards from the plate's newest row, a search by time range
-- forward_records_created_at_idx, and so on (TestLookupPlans checks each).
--
-- Why the drivers say `x >= $1 AND x <= $1` instead of `x = $1`: with an
-- equality the planner drops x from the sort order (x is constant), is left
-- with `ORDER BY id DESC`, and may then walk the primary key backwards
-- filtering x, cheap by its estimate when x is frequent, but a read of the
-- whole table when x's rows are all old (a park that stopped sending). The
-- range matches the same rows and keeps x in the order, which only x's index
-- provides.
--
-- The other filters are applied to the rows the driver yields. Lookups run
-- with plan_cache_mode = force_custom_plan (lookup.go), so a filter left out
-- (NULL) is folded away when the statement is planned.
--
-- $1 plate_no, $2 park_code, $3 berth_code, $4 device_id, $5 status,
-- $6 platform errcode of the latest attempt (LEASE_EXPIRED and REQUEUED
-- logs aside, as in `outbox stats`), $7 created at or after, $8 created
-- before (NULL: no such filter), $9 limit, $10 true when the driver has
-- checked the errcode already: a second check would not change the rows,
-- but the planner, misjudging how many it keeps, would then plan to read
-- every row the driver finds and sort them, instead of stopping at $9.
SELECT r.id, r.message_key, r.api_type, r.status, r.attempt_count, r.last_error,
       r.last_http_status, r.failure_class, r.plate_no, r.park_code, r.berth_code,
       r.device_id, r.created_at, r.updated_at, r.next_retry_at, r.succeeded_at,
       r.ordering_key, r.order_held, r.order_blocked
FROM /*FROM*/
WHERE /*DRIVER*/
  AND ($1::text IS NULL OR r.plate_no = $1::text)
  AND ($2::text IS NULL OR r.park_code = $2::text)
  AND ($3::text IS NULL OR r.berth_code = $3::text)
  AND ($4::text IS NULL OR r.device_id = $4::text)
  AND ($5::text IS NULL OR r.status = $5::text)
  AND ($6::text IS NULL OR $10::boolean OR (
        SELECT e.platform_errcode
        FROM forward_retry_logs e
        WHERE e.record_id = r.id
          AND e.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
        ORDER BY e.id DESC
        LIMIT 1) = $6::text)
  AND ($7::timestamptz IS NULL OR r.created_at >= $7::timestamptz)
  AND ($8::timestamptz IS NULL OR r.created_at < $8::timestamptz)
ORDER BY /*ORDER*/
LIMIT $9;
