-- migration: online

-- Two lookups of `forwarder outbox find` and the console that 0003's indexes
-- cannot serve without reading far more rows than they return
-- (docs/operations.md, "Looking things up"). Both were measured on 1 M rows
-- (internal/outboxdb TestLookupPlans).

-- Newest rows of one park, whatever the berth. forward_records_park_idx is
-- (park_code, berth_code, id): it gives a park's rows berth by berth, so the
-- newest 50 of a park meant fetching and sorting every row of the park
-- (50 000 at 10 M rows and 200 parks), or walking the primary key backwards
-- until enough matched, which reads the whole table for a park that stopped
-- sending long ago. This index walks one park newest first and stops.
CREATE INDEX forward_records_park_id_idx ON forward_records (park_code, id)
    WHERE park_code IS NOT NULL;

-- Rows whose latest attempt got a platform errcode, newest first. The errcode
-- lives in the attempt log only; without this index a search by errcode
-- visited every unfinished row (or every row) and looked up its latest log.
-- Partial: successful replies without an errcode stay out of it, so it holds
-- the rejections, busy answers and duplicates only.
CREATE INDEX forward_retry_logs_errcode_idx ON forward_retry_logs (platform_errcode, record_id)
    WHERE platform_errcode IS NOT NULL;
