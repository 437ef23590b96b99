package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:      "purge",
		Usage:     "Retire the partitions older than --older-than whose messages are all finished",
		UsageText: "forwarder outbox purge --older-than D [--dead-letter] [--operator NAME] [--force] [--dry-run]",
		Description: `Messages and their attempt logs are kept in partitions by creation time, a
day each by default (OUTBOX_PARTITION). purge retires the partitions whose
range ended longer than D ago: each is dropped whole, messages and attempt
logs, when every message in it is finished, never row by row. The delivery
rows of its FAILED messages go with it. A partition holding a PENDING or
IN_PROGRESS row, or a FAILED row blocking its ordering key, stays whole;
with --dead-letter (the dead-letter topic is in use), so does one holding a
FAILED row not yet published to it. purge says, partition by partition,
what it retired and what it kept and why.

Retiring a partition is one short transaction that waits at most 100ms at a
time for its lock on the tables, so purge is safe while the service runs;
the cutoff is fixed when it starts. A message redelivered by Kafka after its
partition was retired is persisted and sent again (the platform answers
"duplicate"), so keep D longer than Kafka's retention when that matters.

That is why D below 24h is refused unless --force is given: the key of a
retired message no longer makes a redelivery of it harmless, and
redeliveries happen in ordinary operation (a rebalance after a crash
re-reads offsets not yet committed).

Each partition retired is recorded in forward_operator_log with who ran it
(--operator, default $USER); a run that retired nothing leaves one row too.

Durations: Go syntax plus days (7d, 36h, 0s).`,
		Flags: []cli.Flag{
			// Not Required: urfave/cli would answer its absence with a page of
			// help and exit status 1; the action refuses it as a usage error.
			&cli.StringFlag{Name: "older-than", Usage: "retire partitions whose range ended longer ago than this (e.g. 7d)"},
			&cli.BoolFlag{Name: "dead-letter", Usage: "the dead-letter topic is in use: keep partitions with FAILED rows not yet published to it"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print what would be retired and what would stay"},
			&cli.BoolFlag{Name: "force", Usage: "accept --older-than below the safe minimum (24h)"},
			// Partitions are retired whole; kept so that scripts written for
			// row batches still run.
			&cli.IntFlag{Name: "batch-size", Usage: "ignored: partitions are retired whole (accepted for scripts written for schema 4)"},
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			if !c.IsSet("older-than") {
				return refusef(c, "--older-than is required: retire the partitions that ended longer ago than this, e.g. --older-than 7d")
			}
			olderThan, err := outboxdb.ParseDuration(c.String("older-than"))
			if err != nil {
				return refusef(c, "--older-than: %v", err)
			}
			if olderThan < outboxdb.MinPurgeAge && !c.Bool("force") {
				return refusef(c, "--older-than %s is below the safe minimum of %s: "+
					"a delivered row's key is what makes a Kafka redelivery of its message harmless, and a message "+
					"redelivered after its partition is retired is sent to the platform again. Add --force to purge anyway.",
					c.String("older-than"), outboxdb.FormatDuration(outboxdb.MinPurgeAge))
			}
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			w := c.App.Writer
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				return purge(ctx, w, pool, purgeRun{
					olderThan: olderThan, given: c.String("older-than"), deadLetter: c.Bool("dead-letter"),
					dryRun: c.Bool("dry-run"), forced: c.Bool("force") && olderThan < outboxdb.MinPurgeAge, operator: operator,
				})
			})
		},
	}
}

// purgeRun is what `outbox purge` was asked.
type purgeRun struct {
	olderThan  time.Duration
	given      string // --older-than as written
	deadLetter bool
	dryRun     bool
	forced     bool // --force was needed
	operator   string
}

func purge(ctx context.Context, w io.Writer, pool *pgxpool.Pool, r purgeRun) error {
	cutoff, err := outboxdb.PurgeCutoff(ctx, pool, r.olderThan)
	if err != nil {
		return err
	}
	at := cutoff.UTC().Format("2006-01-02 15:04:05Z")
	if r.dryRun {
		plan, err := outboxdb.PlanPurge(ctx, pool, cutoff, r.deadLetter, true)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "partitions that ended before %s (older than %s): %d\n", at, r.given, len(plan))
		for _, o := range plan {
			printOutcome(w, o, true)
		}
		fmt.Fprintln(w, "(dry run, nothing changed)")
		return nil
	}
	fmt.Fprintf(w, "retiring the partitions that ended before %s (older than %s) and whose messages are all finished (operator %s)\n",
		at, r.given, console.SafeLine(r.operator))
	res, err := outboxdb.Purge(ctx, pool, outboxdb.PurgeOptions{
		OlderThan: r.olderThan, DeadLetter: r.deadLetter, Operator: r.operator,
		Progress: func(o outboxdb.PartitionOutcome) { printOutcome(w, o, false) },
	})
	parts, msgs, failed := res.Retired()
	// Each partition that held messages is recorded by the database as it
	// is retired; a run that retired none leaves a row of its own, so that
	// every purge is in the log.
	if msgs == 0 {
		filter := fmt.Sprintf("partitions that ended before %s (older than %s): none retired, %s kept", at, r.given, plural.Count(len(res.Kept()), "partition", "partitions"))
		if r.forced {
			filter += " --force"
		}
		if _, auditErr := outboxdb.LogOperatorAction(context.WithoutCancel(ctx), pool, outboxdb.OperatorAction{
			Operator: r.operator, Action: outboxdb.ActionPurge, Filter: filter}); auditErr != nil {
			err = errors.Join(err, auditErr)
		}
	}
	if err != nil {
		return fmt.Errorf("%s retired before the error: %w", plural.Count(parts, "partition", "partitions"), err)
	}
	fmt.Fprintf(w, "retired %s of %s (%d FAILED); kept %s\n", plural.Count(parts, "partition", "partitions"),
		plural.Count(msgs, "message", "messages"), failed, plural.Count(len(res.Kept()), "partition", "partitions"))
	return nil
}

// printOutcome prints one line per partition: "2026-11-20 retired: 1200
// messages, 3 of them FAILED" or "2026-11-21 kept: 3 PENDING rows".
func printOutcome(w io.Writer, o outboxdb.PartitionOutcome, dryRun bool) {
	switch {
	case o.Outcome == outboxdb.PartitionRetired:
		verb := "retired"
		if dryRun {
			verb = "would be retired"
		}
		line := fmt.Sprintf("%s %s: %s", o.Label(), verb, plural.Count(o.Messages, "message", "messages"))
		if o.Failed > 0 {
			line += fmt.Sprintf(", %d of them FAILED", o.Failed)
		}
		fmt.Fprintln(w, line)
	case o.Outcome == outboxdb.PartitionKept:
		fmt.Fprintf(w, "%s kept: %s\n", o.Label(), o.Why())
	default:
		fmt.Fprintf(w, "%s not retired this time: %s\n", o.Label(), o.Why())
	}
}
