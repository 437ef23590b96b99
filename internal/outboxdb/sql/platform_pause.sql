-- Pauses sending on every instance until $1 milliseconds from now, or
-- leaves a longer pause in place (a Retry-After on 429 or 503).
UPDATE forward_platform_state
SET paused_until = greatest(paused_until, now() + $1::bigint * interval '1 millisecond')
RETURNING paused_until;
