-- The insert's last statement, in the same transaction as insert.sql and
-- after it, so with a later snapshot: a message that another transaction
-- stored, delivered and removed from forward_deliveries while insert.sql ran
-- (after its snapshot, before its unique check) was stored twice. Its key
-- is then in two rows of the partitions of the last day (the other
-- transaction started at most a statement timeout before this one), and the
-- insert fails with serialization_failure: nothing of it commits, and the
-- caller runs it again, when the key is found stored (docs/architecture.md,
-- "Dedupe across partitions"). It reads the batch's keys in those
-- partitions only, one index probe each.
--
-- The probe is a LATERAL subquery per key with LIMIT 2, so that it reads
-- the key index whatever the statistics say. As one `= ANY` scan, a
-- partition that autovacuum had not analysed yet (a new day's, a new
-- database's) was planned as a BitmapAnd with the primary key index on
-- created_at, reading every entry of the day's partition on each insert:
-- 5 ms at 70 000 rows, and the insert's key locks held meanwhile made the
-- result writes queue behind it (docs/benchmarks.md, "Latency collapse").
--
-- It also makes the commit wait for the WAL flush whatever the role or the
-- database says: once the insert returns, the Kafka offsets of its messages
-- are committed, so with synchronous_commit off (an administrator's setting
-- for speed) a database crash could lose rows whose messages the group will
-- not read again. A stronger setting (remote_write, remote_apply, on with
-- synchronous standbys) is kept.
--
-- $1 the batch's message keys.
SELECT count(forward_messages_stored_twice(k.key)),
       (SELECT set_config('synchronous_commit', 'on', true)
        WHERE current_setting('synchronous_commit') = 'off')
FROM unnest($1::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (SELECT 1
          FROM forward_messages m
          WHERE m.message_key = k.key
            AND m.created_at > now() - interval '1 day'
          LIMIT 2) AS two) AS c
WHERE c.n > 1;
