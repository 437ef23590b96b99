-- The state every instance shares about the platform (one row, created by
-- the migrations), with the database clock to compare its times with.
SELECT breaker_state, changed_at, coalesce(reason, ''), next_probe_at, paused_until, now()
FROM forward_platform_state;
