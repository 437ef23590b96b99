-- Naive baseline, transaction 1 of 2 per message: persist the message (the
-- textbook outbox insert, one row per statement and per transaction).
-- $1 message_key, $2 api_type, $3 kafka_topic, $4 kafka_partition,
-- $5 kafka_offset, $6 kafka_key, $7 payload, $8 status (PENDING or FAILED),
-- $9 last_error ('' for none), $10-$13 the lookup columns plate_no,
-- park_code, berth_code, device_id ('' for none).
INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
                             kafka_key, payload, status, next_retry_at, last_error,
                             plate_no, park_code, berth_code, device_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text,
        CASE WHEN $8::text = 'PENDING' THEN now() END, nullif($9::text, ''),
        nullif($10::text, ''), nullif($11::text, ''), nullif($12::text, ''), nullif($13::text, ''))
ON CONFLICT (message_key) DO NOTHING
RETURNING id;
