-- Naive baseline, transaction 2 of 2 per message, second statement: the
-- attempt log. $1 record id, $2 attempt number, $3 status, $4 HTTP status,
-- $5 platform errcode, $6 error, $7 duration in ms, $8 next retry time.
INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, http_status,
                                platform_errcode, error_message, duration_ms, next_retry_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);
