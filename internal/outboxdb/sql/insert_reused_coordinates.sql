-- Which records of a batch about to be inserted, each keyed by its Kafka
-- coordinates (it has no messageId), are to be stored under the key a
-- message at reused coordinates takes ($3: the coordinates, '~' and a hash
-- of the payload): those whose coordinates key a row with another payload
-- (an earlier message's, from before the topic was deleted and created
-- again), and those whose $3 key has a row already (a redelivery of such a
-- message, whose coordinates' first row may have been retired since).
-- Kafka redelivers a record byte for byte, so a row under the coordinates
-- with the same payload is this record's own. An absent payload compares
-- as empty.
--
-- Two probes of each partition's forward_messages_key_idx per record, as
-- the insert's own duplicate check.
--
-- $1 message_key (the coordinates), $2 payload, $3 the key at reused
-- coordinates, one element per record. Returns the 1-based positions of
-- the records to store under $3.
SELECT d.n
FROM unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS d(message_key, payload, reused_key, n)
WHERE EXISTS (
        SELECT FROM forward_messages m
        WHERE m.message_key = d.reused_key)
   OR EXISTS (
        SELECT FROM forward_messages m
        WHERE m.message_key = d.message_key
          AND coalesce(m.payload, '') <> coalesce(d.payload, ''))
ORDER BY d.n
