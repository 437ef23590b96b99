-- Retires one partition for `forwarder outbox purge` and retention, if all
-- its messages are finished (forward_partition_retire, migration 0005).
--
-- $1 the partition's lower bound, $2 cutoff, $3 keep FAILED rows not yet
-- published to the dead-letter topic, $4 operator, $5 note for the
-- operator log, $6 lock_timeout in milliseconds, $7 lock attempts.
SELECT outcome, message_count, failed_count, pending_count, in_progress_count,
       blocked_count, unpublished_count, lock_waits
FROM forward_partition_retire($1::timestamptz, $2::timestamptz, $3::boolean, $4::text, $5::text,
                              $6::integer, $7::integer);
