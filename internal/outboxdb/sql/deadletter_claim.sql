-- Claims up to $1 FAILED rows not yet published to the dead-letter topic, for
-- one outbox_dead_letter input.
--
-- The CTE reads forward_deliveries_dead_letter_idx in id order (oldest failures
-- first) and stops after $1 rows. It passes over rows another instance has
-- leased while that lease runs, and, with SKIP LOCKED, rows another statement
-- holds locked this instant (a concurrent claim, a requeue), so that instances
-- never take the same row and never wait on each other.
--
-- A claimed row gets a fresh dead_letter_token, which fences the "published"
-- mark (deadletter_mark.sql), and a lease of $2 milliseconds: if its holder
-- vanishes before the mark, the row is taken again once the lease has run out
-- and is published again (at-least-once). The row itself is not held locked
-- while it is being published: no transaction stays open across a Kafka write.
--
-- updated_at is left alone: publishing does not change the row's delivery
-- state, and `outbox requeue --since` filters on it.
--
-- $1 batch size, $2 lease in milliseconds.
WITH picked AS (
    SELECT id
    FROM forward_deliveries
    WHERE status = 'FAILED'
      AND dead_lettered_at IS NULL
      AND (dead_letter_lease_until IS NULL OR dead_letter_lease_until <= now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE forward_deliveries AS r
    SET dead_letter_token       = gen_random_uuid(),
        dead_letter_lease_until = now() + $2::bigint * interval '1 millisecond'
    WHERE r.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING r.id, r.created_at, r.status, r.attempt_count, r.last_http_status, r.last_error,
              r.updated_at, r.failed_at, r.dead_letter_token
)
-- With its message, read by (id, created_at): one partition per row.
SELECT m.id, m.message_key, m.api_type, m.kafka_topic, m.kafka_partition, m.kafka_offset,
       m.kafka_key, m.payload, c.status, c.attempt_count, c.last_http_status, c.last_error,
       m.created_at, c.updated_at, coalesce(c.failed_at, c.updated_at) AS failed_at,
       c.dead_letter_token::text AS dead_letter_token
FROM claimed c
JOIN forward_messages m ON m.id = c.id AND m.created_at = c.created_at;
