-- The latest operator actions, newest first, for the console: a walk of the
-- primary key. $1 limit.
SELECT id, at, operator, action, filter, rows
FROM forward_operator_log
ORDER BY id DESC
LIMIT $1;
