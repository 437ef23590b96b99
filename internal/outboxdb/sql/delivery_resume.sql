-- Ends the operator's pause now, by operator $1, and records it
-- (forward_delivery_resume, migration 0006).
SELECT was_paused, log_id FROM forward_delivery_resume($1::text);
