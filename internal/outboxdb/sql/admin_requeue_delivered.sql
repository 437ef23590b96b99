-- Requeues one batch of delivered messages (SUCCESS: no delivery row) for
-- `forwarder outbox requeue --status SUCCESS`: each gets a delivery row,
-- PENDING and due now, with attempt_count 0 and a REQUEUED attempt log, as
-- admin_requeue.sql leaves the rows it requeues. Such a message was
-- delivered already and is sent again outside its berth's ordering (it has
-- no ordering key any more); the platform answers a repeat as a duplicate.
--
-- A message's "updated" time is that of its last attempt, and its errcode
-- that of its last attempt (LEASE_EXPIRED and REQUEUED aside). Batches walk
-- ids upwards from $4; ON CONFLICT skips a message requeued meanwhile.
--
-- $1 errcode (NULL: any), $2 within this many milliseconds (NULL: any),
-- $3 message keys (NULL: any), $4 the last id of the previous batch,
-- $5 batch size, $6 the audit note.
WITH picked AS (
    SELECT m.id, m.created_at, m.message_key, octet_length(m.payload) AS size,
           coalesce(last.attempt_number, 0) AS prev_attempts
    FROM forward_messages m
    LEFT JOIN LATERAL (
        SELECT l.attempt_number, l.attempted_at, l.platform_errcode
        FROM forward_retry_logs l
        WHERE l.record_id = m.id AND l.record_created_at = m.created_at
          AND l.result_status NOT IN ('LEASE_EXPIRED', 'REQUEUED')
        ORDER BY l.id DESC
        LIMIT 1) AS last ON true
    WHERE m.id > $4::bigint
      AND ($3::text[] IS NULL OR m.message_key = ANY ($3::text[]))
      AND NOT EXISTS (SELECT 1 FROM forward_deliveries d WHERE d.id = m.id)
      AND ($2::bigint IS NULL OR last.attempted_at >= now() - $2::bigint * interval '1 millisecond')
      AND ($1::text IS NULL OR last.platform_errcode = $1::text)
    ORDER BY m.id
    LIMIT $5
), requeued AS (
    INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
    SELECT id, created_at, message_key, 'PENDING', now(), size
    FROM picked
    ORDER BY id
    ON CONFLICT DO NOTHING
    RETURNING id, created_at
), audit AS (
    INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, error_message, next_retry_at)
    SELECT p.id, p.created_at, p.prev_attempts, 'REQUEUED',
           $6::text || ' (was SUCCESS after ' || p.prev_attempts
               || CASE WHEN p.prev_attempts = 1 THEN ' attempt)' ELSE ' attempts)' END, now()
    FROM picked p
    JOIN requeued r ON r.id = p.id
)
SELECT (SELECT count(*) FROM requeued) AS requeued,
       coalesce((SELECT max(id) FROM picked), 0) AS last_id,
       (SELECT count(*) FROM picked) AS picked;
