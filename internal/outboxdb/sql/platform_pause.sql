-- Pauses sending on every instance until $1 milliseconds from now, or
-- leaves a longer pause in place (a Retry-After on 429 or 503), and tells
-- every instance's listener on channel $2 at commit what is left of the
-- pause, in milliseconds rounded up ('pause <ms>'): they hold at once
-- instead of at their next read of this row.
WITH paused AS (
    UPDATE forward_platform_state
    SET paused_until = greatest(paused_until, now() + $1::bigint * interval '1 millisecond')
    RETURNING paused_until
)
SELECT paused_until,
       pg_notify($2, 'pause ' || ceil(greatest(extract(epoch FROM paused_until - clock_timestamp()), 0) * 1000)::bigint)
FROM paused;
