package outboxdb

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention retires whole partitions (docs/architecture.md, "Retention"):
// `forwarder outbox purge` and the outbox_retry input's retention both run
// Purge.

// Outcomes of a partition in a purge.
const (
	// PartitionRetired: its messages and attempt logs were dropped, with
	// the delivery rows of its FAILED messages (in a dry run: would be).
	PartitionRetired = "RETIRED"
	// PartitionKept: it holds a row that is not finished (see
	// PartitionOutcome.Why).
	PartitionKept = "KEPT"
	// PartitionBusy: the tables could not be locked in time, or another
	// purge was retiring a partition; the next run tries again.
	PartitionBusy = "BUSY"
)

// Lock waits of a retirement: the drop of a partition needs an ACCESS
// EXCLUSIVE lock on the parent tables, and the statements that arrive while
// it waits for it wait behind it, so it waits at most DefaultRetireLockTimeout
// at a time, DefaultRetireLockTries times, pausing in between.
const (
	DefaultRetireLockTimeout = 100 * time.Millisecond
	DefaultRetireLockTries   = 20
)

// PurgeOptions tunes Purge.
type PurgeOptions struct {
	// OlderThan: partitions whose range ended longer ago than this are
	// retired when every message in them is finished. 0 takes every
	// partition whose range ended before the call.
	OlderThan time.Duration
	// DeadLetter says the dead-letter topic is in use: a FAILED row not yet
	// published to it keeps its partition, as an unfinished row does.
	DeadLetter bool
	// Operator is recorded in forward_operator_log for each partition
	// retired (default "retention").
	Operator string
	// DryRun only plans: nothing is retired, and the outcomes say what
	// would be (and how many messages each partition holds).
	DryRun bool
	// Progress, when set, is called after each partition with its outcome.
	Progress func(PartitionOutcome)
	// LockTimeout and LockTries bound the waits for the tables' lock
	// (default DefaultRetireLockTimeout and DefaultRetireLockTries).
	LockTimeout time.Duration
	LockTries   int
}

// PartitionOutcome is what a purge did, or would do, with one partition
// older than its cutoff.
type PartitionOutcome struct {
	// Outcome is PartitionRetired, PartitionKept or PartitionBusy.
	Outcome string
	// Lower and Upper bound the partition's creation times.
	Lower, Upper time.Time
	// Messages is how many messages it held (in a dry run, how many it
	// holds).
	Messages int64
	// Failed counts its FAILED delivery rows: deleted with it when it was
	// retired.
	Failed int64
	// Pending, InProgress, Blocked (FAILED rows blocking their ordering
	// key) and Unpublished (FAILED rows not yet published to the
	// dead-letter topic) are its delivery rows of each kind.
	Pending, InProgress, Blocked, Unpublished int64
	// LockWaits counts the lock waits that timed out.
	LockWaits int
	// deadLetter is PurgeOptions.DeadLetter, for Why.
	deadLetter bool
	// notTried: an older partition was busy, so this run left it.
	notTried bool
}

// Label names the partition: its day, or its bounds (Partition.Label).
func (o PartitionOutcome) Label() string { return partitionLabel(o.Lower, o.Upper) }

// Why says what keeps a partition ("3 PENDING rows, 1 IN_PROGRESS row"),
// "" for a retired one.
func (o PartitionOutcome) Why() string {
	switch o.Outcome {
	case PartitionRetired:
		return ""
	case PartitionBusy:
		switch {
		case o.notTried:
			return "not tried: an older partition could not be retired"
		case o.LockWaits == 0:
			return "another purge was retiring a partition"
		}
		return fmt.Sprintf("the tables could not be locked in %d waits (long transactions?)", o.LockWaits)
	}
	var why []string
	add := func(n int64, one, many string) {
		switch {
		case n == 1:
			why = append(why, "1 "+one)
		case n > 1:
			why = append(why, fmt.Sprintf("%d %s", n, many))
		}
	}
	add(o.Pending, "PENDING row", "PENDING rows")
	add(o.InProgress, "IN_PROGRESS row", "IN_PROGRESS rows")
	add(o.Blocked, "FAILED row blocking its ordering key", "FAILED rows blocking their ordering keys")
	if o.deadLetter {
		add(o.Unpublished, "FAILED row not yet published to the dead-letter topic",
			"FAILED rows not yet published to the dead-letter topic")
	}
	return strings.Join(why, ", ")
}

func (o *PartitionOutcome) decide() {
	o.Outcome = PartitionRetired
	if o.Pending+o.InProgress+o.Blocked > 0 || (o.deadLetter && o.Unpublished > 0) {
		o.Outcome = PartitionKept
	}
}

// PurgeResult says what Purge did.
type PurgeResult struct {
	// Cutoff is the database time before which partitions had to end.
	Cutoff time.Time
	// Partitions are the partitions that ended before Cutoff, oldest
	// first, with their outcomes.
	Partitions []PartitionOutcome
}

// Retired counts the partitions retired and the messages and FAILED rows
// they held.
func (r PurgeResult) Retired() (partitions int, messages, failed int64) {
	for _, p := range r.Partitions {
		if p.Outcome == PartitionRetired {
			partitions++
			messages += p.Messages
			failed += p.Failed
		}
	}
	return partitions, messages, failed
}

// Kept returns the partitions that ended before the cutoff and stay.
func (r PurgeResult) Kept() []PartitionOutcome {
	var kept []PartitionOutcome
	for _, p := range r.Partitions {
		if p.Outcome != PartitionRetired {
			kept = append(kept, p)
		}
	}
	return kept
}

// PurgeCutoff is the database time older-than ago.
func PurgeCutoff(ctx context.Context, q Querier, olderThan time.Duration) (time.Time, error) {
	if olderThan < 0 {
		return time.Time{}, fmt.Errorf("older-than %s is negative", olderThan)
	}
	var cutoff time.Time
	if err := q.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return time.Time{}, fmt.Errorf("computing purge cutoff: %w", err)
	}
	return cutoff, nil
}

// PlanPurge lists the partitions whose range ended before cutoff, oldest
// first, each with what Purge would do with it now; with countMessages it
// also counts their messages (a scan of each partition's primary key).
func PlanPurge(ctx context.Context, q Querier, cutoff time.Time, deadLetter, countMessages bool) ([]PartitionOutcome, error) {
	rows, err := q.Query(ctx, purgePlanSQL, cutoff, countMessages)
	if err != nil {
		return nil, fmt.Errorf("planning the purge: %w", err)
	}
	var (
		o    PartitionOutcome
		plan []PartitionOutcome
	)
	_, err = pgx.ForEachRow(rows, []any{&o.Lower, &o.Upper, &o.Messages, &o.Failed, &o.Pending, &o.InProgress, &o.Blocked, &o.Unpublished}, func() error {
		o.deadLetter = deadLetter
		o.decide()
		plan = append(plan, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("planning the purge: %w", err)
	}
	return plan, nil
}

// Purge retires the partitions of messages and attempt logs whose range
// ended longer than opts.OlderThan ago and whose every message is finished
// (docs/architecture.md, "Retention"): each is dropped whole, with the
// delivery rows of its FAILED messages, in one short transaction that
// records it in forward_operator_log. A partition holding a PENDING or
// IN_PROGRESS row, a FAILED row blocking its ordering key or, with
// opts.DeadLetter, a FAILED row not yet published to the dead-letter topic,
// stays whole. It is safe while the service runs: the drop waits at most
// opts.LockTimeout at a time for its lock and holds it for milliseconds.
// The cutoff is fixed when it starts.
func Purge(ctx context.Context, q Querier, opts PurgeOptions) (PurgeResult, error) {
	cutoff, err := PurgeCutoff(ctx, q, opts.OlderThan)
	if err != nil {
		return PurgeResult{}, err
	}
	res := PurgeResult{Cutoff: cutoff}
	plan, err := PlanPurge(ctx, q, cutoff, opts.DeadLetter, opts.DryRun)
	if err != nil {
		return res, err
	}
	operator := opts.Operator
	if operator == "" {
		operator = "retention"
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultRetireLockTimeout
	}
	tries := opts.LockTries
	if tries <= 0 {
		tries = DefaultRetireLockTries
	}
	note := "older than " + FormatDuration(opts.OlderThan)
	busy := false
	for _, o := range plan {
		switch {
		case busy && o.Outcome == PartitionRetired:
			// Each would wait for the lock as long again: the next run
			// tries them.
			o.Outcome, o.notTried = PartitionBusy, true
		case !opts.DryRun && o.Outcome == PartitionRetired:
			// The plan's counts were read without a lock: the function
			// counts again under it, and has the last word.
			err := q.QueryRow(ctx, purgeSQL, o.Lower, cutoff, opts.DeadLetter, operator, note,
				max(timeout.Milliseconds(), 1), tries).
				Scan(&o.Outcome, &o.Messages, &o.Failed, &o.Pending, &o.InProgress, &o.Blocked, &o.Unpublished, &o.LockWaits)
			if err != nil {
				return res, fmt.Errorf("retiring partition %s: %w", o.Label(), err)
			}
			if o.Outcome == "GONE" {
				// Retired by someone else since the plan.
				continue
			}
			busy = o.Outcome == PartitionBusy
		}
		res.Partitions = append(res.Partitions, o)
		if opts.Progress != nil {
			opts.Progress(o)
		}
	}
	return res, nil
}
