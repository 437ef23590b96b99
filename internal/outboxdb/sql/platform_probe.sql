-- Takes the next probe of an open breaker: of all instances asking, the
-- first whose update finds the probe time come gets it (the row lock orders
-- them), and moves the next one $1 milliseconds on. At most one probe per
-- interval is sent, across every instance that shares the database.
UPDATE forward_platform_state
SET next_probe_at = now() + $1::bigint * interval '1 millisecond'
WHERE breaker_state = 'OPEN'
  AND next_probe_at <= now()
RETURNING true;
