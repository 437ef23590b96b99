-- Looks up rows that an insert (insert.sql) found already present, so that a
-- caller learns the id and status of a redelivered message's row. It runs as
-- its own statement after the insert: only a new snapshot is sure to see a row
-- that a concurrent inserter committed while the insert waited on its key.
--
-- $1 message keys.
SELECT id, message_key, status
FROM forward_records
WHERE message_key = ANY($1::text[]);
