-- Persists one batch of Kafka messages as new outbox rows, in one statement.
--
-- The batch arrives as parallel arrays, one element per row, so the statement
-- text and its prepared plan stay the same whatever the batch size. ON CONFLICT
-- DO NOTHING makes a redelivered message a no-op: the row already there keeps
-- its status, attempts and payload, whatever state it is in. The caller removes
-- duplicate keys from the arrays first and orders them by key, so that
-- concurrent inserters meet overlapping keys in the same order and cannot
-- deadlock on each other's speculative insertions.
--
-- A PENDING row is due at once (next_retry_at = now()); a FAILED row is
-- finished (next_retry_at NULL), as forward_records_due_check requires.
--
-- The NOTIFY runs in the same statement, hence the same (implicit)
-- transaction: it is delivered when the rows are committed and never for rows
-- that were not, and only when a row is PENDING, so duplicates and bad messages
-- do not wake the dispatchers. pg_notify is volatile, so the "notified" CTE is
-- not inlined; the scalar subquery in the final SELECT makes sure it runs once.
--
-- Rows whose key already existed are not returned: RETURNING only sees the
-- rows this statement inserted.
--
-- $1 message_key, $2 api_type, $3 kafka_topic, $4 kafka_partition,
-- $5 kafka_offset, $6 kafka_key (NULL elements for no key), $7 payload,
-- $8 status (PENDING or FAILED), $9 last_error ('' for none),
-- $10 the notification channel.
WITH ins AS (
    INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition,
                                 kafka_offset, kafka_key, payload, status,
                                 next_retry_at, last_error)
    SELECT u.message_key, u.api_type, u.kafka_topic, u.kafka_partition,
           u.kafka_offset, u.kafka_key, u.payload, u.status,
           CASE WHEN u.status = 'PENDING' THEN now() END,
           nullif(u.last_error, '')
    FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[],
                $6::bytea[], $7::bytea[], $8::text[], $9::text[])
         AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
              kafka_key, payload, status, last_error)
    ON CONFLICT (message_key) DO NOTHING
    RETURNING id, message_key, status
), notified AS (
    SELECT pg_notify($10, '')
    FROM ins
    WHERE status = 'PENDING'
    LIMIT 1
)
SELECT id, message_key, status, (SELECT count(*) FROM notified) AS notified
FROM ins;
