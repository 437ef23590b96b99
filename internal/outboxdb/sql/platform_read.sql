-- The state every instance shares about the platform (one row, created by
-- the migrations), with the database clock to compare its times with, and
-- what is left of a pause and until the next probe as of the moment the
-- row is read (clock_timestamp(), not the transaction's start): a reader
-- adds them to its own clock when the reply arrives, so that a slow reply
-- lengthens a pause rather than shortens it. The operator's pause
-- (migration 0006): whether it is in force, and what is left of it (NULL:
-- until resumed).
SELECT breaker_state, changed_at, coalesce(reason, ''), next_probe_at, paused_until, now(),
       (greatest(extract(epoch FROM paused_until - clock_timestamp()), 0) * 1000)::bigint,
       (greatest(extract(epoch FROM next_probe_at - clock_timestamp()), 0) * 1000)::bigint,
       pause_since, pause_until, coalesce(pause_by, ''), coalesce(pause_reason, ''),
       pause_since IS NOT NULL AND (pause_until IS NULL OR pause_until > clock_timestamp()),
       (greatest(extract(epoch FROM pause_until - clock_timestamp()), 0) * 1000)::bigint
FROM forward_platform_state;
