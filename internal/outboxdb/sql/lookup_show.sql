-- One row for `forwarder outbox show` and the console's record page, by
-- message_key ($1) or id ($2, NULL when the argument is not a number),
-- through the view forward_records: a probe of forward_messages_key_idx and
-- one of the primary key in each partition, then the row's delivery state
-- and last attempt by its key. A number can be both a key and another row's
-- id: the key's row comes first.
SELECT r.id, r.message_key, r.api_type, r.kafka_topic, r.kafka_partition, r.kafka_offset,
       r.kafka_key, r.payload, r.status, r.attempt_count, r.next_retry_at,
       r.last_http_status, r.last_error, r.created_at, r.updated_at, r.succeeded_at,
       r.claimed_by, r.claimed_at, r.failure_class, r.failed_at, r.requeue_rounds,
       r.lease_returns, r.ordering_key, r.order_held, r.order_blocked,
       r.plate_no, r.park_code, r.berth_code, r.device_id, r.dead_lettered_at
FROM forward_records r
WHERE r.message_key = $1::text OR r.id = $2::bigint
ORDER BY (r.message_key = $1::text) DESC
LIMIT 2;
