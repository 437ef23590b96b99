-- The state every instance shares about the platform (one row, created by
-- the migrations), with the database clock to compare its times with, and
-- what is left of a pause and until the next probe as of the moment the
-- row is read (clock_timestamp(), not the transaction's start): a reader
-- adds them to its own clock when the reply arrives, so that a slow reply
-- lengthens a pause rather than shortens it.
SELECT breaker_state, changed_at, coalesce(reason, ''), next_probe_at, paused_until, now(),
       (greatest(extract(epoch FROM paused_until - clock_timestamp()), 0) * 1000)::bigint,
       (greatest(extract(epoch FROM next_probe_at - clock_timestamp()), 0) * 1000)::bigint
FROM forward_platform_state;
