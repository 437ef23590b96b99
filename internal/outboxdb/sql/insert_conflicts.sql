-- Which records of a batch that was just inserted have a key stored with
-- another payload: not a redelivery of the stored message (Kafka redelivers
-- a record byte for byte) but a different message reusing its key, which
-- the insert skipped as a duplicate. Run only for a batch some of whose
-- records were not inserted, after it committed; the records it did insert
-- match their own rows. A key in several records of the batch is stored
-- with the first, so the others are compared with it. An absent payload
-- (a record stored without one) compares as empty.
--
-- One probe of each partition's forward_messages_key_idx per record, as
-- the insert's own duplicate check.
--
-- $1 message_key, $2 payload, one element per record. Returns the 1-based
-- positions of the records whose key holds another payload.
SELECT d.n
FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS d(message_key, payload, n)
WHERE EXISTS (
    SELECT FROM forward_messages m
    WHERE m.message_key = d.message_key
      AND coalesce(m.payload, '') <> coalesce(d.payload, ''))
ORDER BY d.n
