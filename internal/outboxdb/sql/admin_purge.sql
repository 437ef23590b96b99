-- Deletes one batch of old SUCCESS rows and their attempt logs for
-- `forwarder outbox purge`.
--
-- Age is by succeeded_at: a row delivered late, after an outage, is kept for
-- the whole retention period after its delivery. succeeded_at is never earlier
-- than created_at, so the scan walks forward_records_created_at_idx up to the
-- cutoff and filters there; PENDING and FAILED rows are never touched.
-- Batches walk (created_at, id) from the previous batch's last row ($3, $4),
-- so the unfinished rows in that range are read once, not once per batch.
-- SKIP LOCKED: a row someone holds is left for the next run instead of
-- stalling the purge; finished rows are normally locked by nobody.
--
-- Logs are deleted explicitly (rather than by ON DELETE CASCADE's per-row
-- trigger) so they are counted and go in one join.
--
-- $1 cutoff, $2 batch size, $3 created_at and $4 id of the last row seen
-- (NULL for the first batch).
WITH doomed AS (
    SELECT id, created_at
    FROM forward_records
    WHERE created_at < $1::timestamptz
      -- The plain created_at bound is what the index scan starts from.
      AND ($3::timestamptz IS NULL
           OR (created_at >= $3::timestamptz AND (created_at, id) > ($3::timestamptz, $4::bigint)))
      AND status = 'SUCCESS'
      AND succeeded_at < $1::timestamptz
    ORDER BY created_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), logs AS (
    DELETE FROM forward_retry_logs l
    USING doomed
    WHERE l.record_id = doomed.id
    RETURNING l.id
), records AS (
    DELETE FROM forward_records r
    USING doomed
    WHERE r.id = doomed.id
    RETURNING r.id
), last AS (
    SELECT created_at, id FROM doomed ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM records) AS records,
       (SELECT count(*) FROM logs) AS logs,
       (SELECT created_at FROM last) AS last_created_at,
       (SELECT id FROM last) AS last_id;
