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
-- $1 the batch's message keys.
SELECT count(forward_messages_stored_twice(d.message_key))
FROM (SELECT m.message_key
      FROM forward_messages m
      WHERE m.message_key = ANY ($1::text[])
        AND m.created_at > now() - interval '1 day'
      GROUP BY m.message_key
      HAVING count(*) > 1) AS d;
