-- Claims up to $1 FAILED rows not yet published to the dead-letter topic, for
-- one outbox_dead_letter input.
--
-- The CTE reads forward_records_dead_letter_idx in id order (oldest failures
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
    FROM forward_records
    WHERE status = 'FAILED'
      AND dead_lettered_at IS NULL
      AND (dead_letter_lease_until IS NULL OR dead_letter_lease_until <= now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE forward_records AS r
SET dead_letter_token       = gen_random_uuid(),
    dead_letter_lease_until = now() + $2::bigint * interval '1 millisecond'
-- = ANY(ARRAY(...)) rather than a join, as in claim.sql: always the primary
-- key, never a hash join over the whole table.
WHERE r.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING r.id, r.message_key, r.api_type, r.kafka_topic, r.kafka_partition, r.kafka_offset,
          r.kafka_key, r.payload, r.attempt_count, r.last_http_status, r.last_error,
          r.created_at, r.updated_at, r.dead_letter_token::text AS dead_letter_token;
