-- Hand-batched baseline: one batch of messages in one statement, as
-- parallel arrays. Keys that already have a row are skipped, and only the
-- new rows come back. $1 message_key, $2 api_type, $3 kafka_topic,
-- $4 kafka_partition, $5 kafka_offset, $6 kafka_key, $7 payload, $8 status,
-- $9 last_error ('' for none), $10-$13 the lookup columns plate_no,
-- park_code, berth_code, device_id ('' for none), which `outbox find`
-- needs as the forwarder's rows have them.
INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
                             kafka_key, payload, status, next_retry_at, last_error,
                             plate_no, park_code, berth_code, device_id)
SELECT u.message_key, u.api_type, u.kafka_topic, u.kafka_partition, u.kafka_offset,
       u.kafka_key, u.payload, u.status,
       CASE WHEN u.status = 'PENDING' THEN now() END, nullif(u.last_error, ''),
       nullif(u.plate_no, ''), nullif(u.park_code, ''), nullif(u.berth_code, ''), nullif(u.device_id, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[],
            $6::bytea[], $7::bytea[], $8::text[], $9::text[],
            $10::text[], $11::text[], $12::text[], $13::text[])
     AS u(message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
          kafka_key, payload, status, last_error, plate_no, park_code, berth_code, device_id)
ON CONFLICT (message_key) DO NOTHING
RETURNING id, message_key;
