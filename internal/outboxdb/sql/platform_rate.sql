-- Takes $1 tokens of the global rate limit: a token bucket of $3 tokens
-- refilled at $2 per second, shared by every instance. When the bucket holds
-- fewer than $1 the tokens stay, and the reply says how many there are, so
-- that the caller knows how long to wait.
--
-- A reservation lost in a crash only gives tokens back, so the commit does
-- not wait for the WAL flush.
--
-- $1 tokens wanted, $2 rate per second, $3 bucket size.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), bucket AS (
    SELECT least($3::float8, rate_tokens
                 + extract(epoch FROM clock_timestamp() - rate_refilled_at) * $2::float8) AS tokens
    FROM forward_platform_state
    FOR UPDATE
)
UPDATE forward_platform_state
SET rate_tokens      = CASE WHEN bucket.tokens >= $1::float8 THEN bucket.tokens - $1::float8 ELSE bucket.tokens END,
    rate_refilled_at = clock_timestamp()
FROM bucket, async
WHERE async.done = 'off'
RETURNING bucket.tokens >= $1::float8 AS granted, bucket.tokens;
