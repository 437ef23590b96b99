-- The row a probe of an open breaker carries: claim.sql with this filter in
-- place of the one of its "locked" part (which reads the same columns), so
-- the probe is claimed, leased and counted as any claim is ($1 is 1).
--
-- A probe tests the platform, so it goes out with a message that is not
-- failing on its own (docs/architecture.md, "Protecting the platform"): of
-- the candidates, one whose attempts have not been spent (failures while
-- the platform was down are not counted), of those one that has never
-- failed (last_error is NULL: a failed probe leaves its error, a row given
-- back unsent keeps none), and then the one attempted or given back longest
-- ago. A failed probe counts no attempt, so without the second rule the
-- messages earlier probes carried, having waited longest, would each be
-- probed again before a new message that could show the platform is up.
-- The row the last probe carried was just written, so it comes last: a
-- probe never takes the same row twice in a row while another is due. The candidates are the first due rows and the newest due
-- rows, so that a message never attempted is found even behind a backlog of
-- older retries; both are read through indexes, at most 50 rows each (the
-- newest among the last 10 000 ids only). Held rows of an ordering key are
-- never due, so any key's head may carry it.
WHERE id = (
    SELECT c.id
    FROM ((SELECT id, attempt_count, last_error IS NOT NULL AS failed, updated_at
           FROM forward_deliveries
           WHERE status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
             AND next_retry_at <= now()
           ORDER BY next_retry_at, id
           LIMIT 50)
          UNION
          (SELECT id, attempt_count, last_error IS NOT NULL AS failed, updated_at
           FROM forward_deliveries
           WHERE id > (SELECT max(id) - 10000 FROM forward_deliveries)
             AND status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
             AND next_retry_at <= now()
           ORDER BY id DESC
           LIMIT 50)) AS c
    ORDER BY c.attempt_count, c.failed, c.updated_at, c.id
    LIMIT 1)
  AND status IN ('PENDING', 'IN_PROGRESS') AND NOT order_held
  AND next_retry_at <= now()
LIMIT $1
FOR UPDATE SKIP LOCKED
