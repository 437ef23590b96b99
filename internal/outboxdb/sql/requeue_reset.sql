-- What a requeue sets on a row of forward_deliveries, the same for an
-- operator's requeue (admin_requeue.sql) and the automatic one
-- (compensate.sql): back to PENDING, due now, its attempts reset and its
-- failure class and times gone (a row that fails again gets new ones: its
-- next failure is weighed as a new message's, docs/architecture.md, "No row
-- FAILED by an outage"); its claim cleared, which fences out the late result
-- of a holder whose lease expired; out of the dead-letter topic's
-- bookkeeping, so a row that fails again is published again and a publish
-- under way is fenced out; no longer blocking its ordering key. Each
-- statement sets order_held (requeue_held.sql) and updated_at itself.
status                  = 'PENDING',
next_retry_at           = now(),
attempt_count           = 0,
failure_class           = NULL,
failed_at               = NULL,
failed_attempt_at       = NULL,
claim_token             = NULL,
claimed_by              = NULL,
claimed_at              = NULL,
dead_lettered_at        = NULL,
dead_letter_token       = NULL,
dead_letter_lease_until = NULL,
order_blocked           = false
