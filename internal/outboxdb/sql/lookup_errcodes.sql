-- The platform errcode of each given row's latest attempt (LEASE_EXPIRED and
-- REQUEUED logs aside, as in `outbox stats`), for the rows a search found.
-- $1 record ids (at most the search's limit).
SELECT DISTINCT ON (record_id) record_id, platform_errcode
FROM forward_retry_logs
WHERE record_id = ANY ($1::bigint[])
  AND result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
ORDER BY record_id, id DESC;
