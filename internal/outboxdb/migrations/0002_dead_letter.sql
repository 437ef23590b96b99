-- migration: online

-- The optional dead-letter topic (the outbox_dead_letter input): every
-- FAILED row is published to Kafka, at least once, and marked so that it is
-- not published again.
ALTER TABLE forward_records
    -- When the row was published to the dead-letter topic; NULL until then.
    -- A requeue clears it, so a row that fails again is published again.
    ADD COLUMN dead_lettered_at        timestamptz,
    -- The publisher's claim on a FAILED row, like claim_token and the lease
    -- of a dispatch: the token fences the "published" write, and once the
    -- lease has run out (its holder vanished) another instance may take the
    -- row. Kept apart from claim_token so that the dispatcher's fences and
    -- the dead-letter ones never meet.
    ADD COLUMN dead_letter_token       uuid,
    ADD COLUMN dead_letter_lease_until timestamptz;

-- Serves the dead-letter claim (FAILED rows not yet published, in id order).
-- Published rows leave it, so its size is the backlog of the topic, not the
-- number of failures ever. Without the dead-letter input it holds every
-- FAILED row, a small part of the table.
CREATE INDEX forward_records_dead_letter_idx ON forward_records (id)
    WHERE status = 'FAILED' AND dead_lettered_at IS NULL;
