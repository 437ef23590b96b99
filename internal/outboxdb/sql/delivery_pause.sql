-- Pauses delivery until $1 (NULL: until resumed), by operator $2 for reason
-- $3, and records it in forward_operator_log (forward_delivery_pause,
-- migration 0006).
SELECT since, log_id FROM forward_delivery_pause($1::timestamptz, $2::text, $3::text);
