package outboxcli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:      "purge",
		Usage:     "Delete SUCCESS rows delivered longer ago than --older-than, and their attempt logs, in batches",
		UsageText: "forwarder outbox purge --older-than D [--batch-size N] [--operator NAME] [--force] [--dry-run]",
		Description: `Age is by succeeded_at, the time of delivery. PENDING, IN_PROGRESS and FAILED
rows are never deleted. Each batch of --batch-size rows is one short
transaction, so purge is safe while the service runs; the cutoff is fixed
when it starts. A message redelivered by Kafka after its row was purged is
persisted and sent again (the platform answers "duplicate"), so keep D longer
than Kafka's retention when that matters.

That is why D below 24h is refused unless --force is given: the key of a
purged row no longer makes a redelivery of its message harmless, and
redeliveries happen in ordinary operation (a rebalance after a crash
re-reads offsets not yet committed).

It prints what it will delete (how many rows, which cutoff) before it
starts, and records who ran it (--operator, default $USER), the cutoff and
the number of rows in forward_operator_log.

Durations: Go syntax plus days (7d, 36h, 0s).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "older-than", Required: true, Usage: "delete rows delivered longer ago than this (e.g. 7d)"},
			&cli.IntFlag{Name: "batch-size", Value: outboxdb.DefaultAdminBatchSize, Usage: "rows per transaction"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print how many rows would be deleted"},
			&cli.BoolFlag{Name: "force", Usage: "accept --older-than below the safe minimum (24h)"},
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			olderThan, err := outboxdb.ParseDuration(c.String("older-than"))
			if err != nil {
				return cli.Exit(fmt.Sprintf("outbox purge: --older-than: %v", err), 2)
			}
			if c.Int("batch-size") <= 0 {
				return cli.Exit("outbox purge: --batch-size must be positive", 2)
			}
			if olderThan < outboxdb.MinPurgeAge && !c.Bool("force") {
				return cli.Exit(fmt.Sprintf("outbox purge: --older-than %s is below the safe minimum of %s: "+
					"a delivered row's key is what makes a Kafka redelivery of its message harmless, and a message "+
					"redelivered after its row is purged is sent to the platform again. Add --force to purge anyway.",
					c.String("older-than"), outboxdb.FormatDuration(outboxdb.MinPurgeAge)), 2)
			}
			operator, err := operatorName(c)
			if err != nil {
				return cli.Exit(fmt.Sprintf("outbox purge: %v", err), 2)
			}
			w := c.App.Writer
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				cutoff, err := outboxdb.PurgeCutoff(ctx, pool, olderThan)
				if err != nil {
					return err
				}
				n, err := outboxdb.CountPurge(ctx, pool, cutoff)
				if err != nil {
					return err
				}
				at := cutoff.UTC().Format("2006-01-02 15:04:05Z")
				if c.Bool("dry-run") {
					fmt.Fprintf(w, "%s delivered before %s would be deleted (dry run, nothing changed)\n", plural(n, "SUCCESS row", "SUCCESS rows"), at)
					return nil
				}
				fmt.Fprintf(w, "deleting %s delivered before %s (older than %s) and their attempt logs (operator %s)\n",
					plural(n, "SUCCESS row", "SUCCESS rows"), at, c.String("older-than"), operator)
				res, err := outboxdb.Purge(ctx, pool, outboxdb.PurgeOptions{OlderThan: olderThan, BatchSize: c.Int("batch-size")})
				filter := fmt.Sprintf("status=SUCCESS delivered before %s (older than %s)", at, c.String("older-than"))
				if c.Bool("force") && olderThan < outboxdb.MinPurgeAge {
					filter += " --force"
				}
				// Recorded whatever happened: the batches before an error stay.
				if _, auditErr := outboxdb.LogOperatorAction(context.WithoutCancel(ctx), pool, outboxdb.OperatorAction{
					Operator: operator, Action: outboxdb.ActionPurge, Filter: filter, Rows: res.Records}); auditErr != nil {
					err = errors.Join(err, auditErr)
				}
				if err != nil {
					return fmt.Errorf("%s deleted before the error: %w", plural(res.Records, "row", "rows"), err)
				}
				fmt.Fprintf(w, "deleted %s delivered before %s and %s, in %s\n",
					plural(res.Records, "SUCCESS row", "SUCCESS rows"), res.Cutoff.UTC().Format("2006-01-02 15:04:05Z"),
					plural(res.Logs, "attempt log", "attempt logs"), plural(res.Batches, "batch", "batches"))
				return nil
			})
		},
	}
}
