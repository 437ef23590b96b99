-- Moves the circuit breaker shared by every instance from one of the states
-- in $1 to $2, and says whether this call made the change (another instance
-- may have made it first). Opening schedules the first probe $5 milliseconds
-- from now.
--
-- $1 states it may move from, $2 the new state, $3 instance, $4 reason,
-- $5 probe interval in milliseconds.
UPDATE forward_platform_state
SET breaker_state = $2::text,
    changed_at    = now(),
    changed_by    = $3::text,
    reason        = $4::text,
    next_probe_at = CASE WHEN $2::text = 'OPEN' THEN now() + $5::bigint * interval '1 millisecond'
                         ELSE next_probe_at END
WHERE breaker_state = ANY ($1::text[])
RETURNING true;
