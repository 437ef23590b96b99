-- Records what an operator did (`forwarder outbox requeue|purge`, console
-- actions): who, what, on which rows, how many. $1 operator, $2 action,
-- $3 filter (as the operator gave it, in words), $4 rows changed.
INSERT INTO forward_operator_log (operator, action, filter, rows)
VALUES ($1::text, $2::text, $3::text, $4::bigint)
RETURNING id, at;
