-- Finds rows for `forwarder outbox find` and the console's search, newest
-- first, at most @limit. Never a scan of a table: lookup.go picks one
-- "driver" per search, the most selective filter given, whose statement
-- (lookup_find_messages.sql, lookup_find_errcode.sql or
-- lookup_find_status.sql) walks one index in that index's order and stops
-- after @limit rows; it is pasted in the FROM below (the fragments are
-- constants; values stay parameters). TestLookupPlans checks each search.
--
-- The driver finds the rows through the tables (the message, its delivery
-- row, its attempts); this statement then reads those @limit rows through
-- forward_records, which says how a delivered message was delivered (its
-- last attempt), so that each column is spelled once, in the view. The
-- driver never joins forward_messages by (id, created_at): PostgreSQL
-- counts the matches of such a join as if the two columns were unrelated
-- (a millionth of a millionth), and would then plan to join every row of
-- the index the driver walks, not the first @limit.
--
-- @plate, @park, @berth, @device, @status, @errcode (platform errcode of
-- the latest attempt, LEASE_EXPIRED and REQUEUED logs aside, as in `outbox
-- stats`), @since (created at or after), @until (created before): NULL when
-- not given. Lookups run with plan_cache_mode = force_custom_plan
-- (lookup.go), so a filter left out is folded away when the statement is
-- planned, and with it the join to the delivery rows when no filter reads
-- them; the time filters leave out the partitions outside the range.
SELECT r.id, r.message_key, r.api_type, r.status, r.attempt_count, r.last_error,
       r.last_http_status, r.failure_class, r.plate_no, r.park_code, r.berth_code,
       r.device_id, r.created_at, r.updated_at, r.next_retry_at, r.succeeded_at,
       r.ordering_key, r.order_held, r.order_blocked
FROM (
/*ROWS*/
) k
JOIN forward_records r ON r.id = k.id AND r.created_at = k.created_at
ORDER BY /*RESULT ORDER*/;
