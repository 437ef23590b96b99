-- Hand-batched baseline: one batch of messages in one statement, as
-- parallel arrays. Keys that already have a row are skipped, and only the
-- new rows come back. $1 message_key, $2 api_type, $3 kafka_topic,
-- $4 kafka_partition, $5 kafka_offset, $6 kafka_key, $7 payload, $8 status,
-- $9 last_error ('' for none).
INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
                             kafka_key, payload, status, next_retry_at, last_error)
SELECT u.message_key, u.api_type, u.kafka_topic, u.kafka_partition, u.kafka_offset,
       u.kafka_key, u.payload, u.status,
       CASE WHEN u.status = 'PENDING' THEN now() END, nullif(u.last_error, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[],
            $6::bytea[], $7::bytea[], $8::text[], $9::text[])
     AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
          kafka_key, payload, status, last_error)
ON CONFLICT (message_key) DO NOTHING
RETURNING id, message_key;
