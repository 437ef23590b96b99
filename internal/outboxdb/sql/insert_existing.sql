-- Looks up rows that an insert (insert.sql) found already present, so that a
-- caller learns the id and status of a redelivered message's row. It runs as
-- its own statement after the insert: only a new snapshot is sure to see a row
-- that a concurrent inserter committed while the insert waited on its key.
-- A message without a delivery row was delivered.
--
-- $1 message keys.
SELECT m.id, m.message_key, coalesce(d.status, 'SUCCESS')
FROM forward_messages m
LEFT JOIN forward_deliveries d ON d.id = m.id
WHERE m.message_key = ANY ($1::text[]);
