package outboxcli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:      "purge",
		Usage:     "Delete SUCCESS rows delivered longer ago than --older-than, and their attempt logs, in batches",
		UsageText: "forwarder outbox purge --older-than D [--batch-size N] [--dry-run]",
		Description: `Age is by succeeded_at, the time of delivery. PENDING, IN_PROGRESS and FAILED
rows are never deleted. Each batch of --batch-size rows is one short
transaction, so purge is safe while the service runs; the cutoff is fixed
when it starts. A message redelivered by Kafka after its row was purged is
persisted and sent again (the platform answers "duplicate"), so keep D longer
than Kafka's retention when that matters.

Durations: Go syntax plus days (7d, 36h, 0s).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "older-than", Required: true, Usage: "delete rows delivered longer ago than this (e.g. 7d)"},
			&cli.IntFlag{Name: "batch-size", Value: outboxdb.DefaultAdminBatchSize, Usage: "rows per transaction"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print how many rows would be deleted"},
		},
		Action: func(c *cli.Context) error {
			olderThan, err := outboxdb.ParseDuration(c.String("older-than"))
			if err != nil {
				return cli.Exit(fmt.Sprintf("outbox purge: --older-than: %v", err), 2)
			}
			if c.Int("batch-size") <= 0 {
				return cli.Exit("outbox purge: --batch-size must be positive", 2)
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				if c.Bool("dry-run") {
					cutoff, err := outboxdb.PurgeCutoff(ctx, pool, olderThan)
					if err != nil {
						return err
					}
					n, err := outboxdb.CountPurge(ctx, pool, cutoff)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%d SUCCESS rows delivered before %s would be deleted (dry run, nothing changed)\n",
						n, cutoff.UTC().Format("2006-01-02 15:04:05Z"))
					return nil
				}
				res, err := outboxdb.Purge(ctx, pool, outboxdb.PurgeOptions{OlderThan: olderThan, BatchSize: c.Int("batch-size")})
				if err != nil {
					return fmt.Errorf("%d rows deleted before the error: %w", res.Records, err)
				}
				fmt.Fprintf(c.App.Writer, "deleted %d SUCCESS rows delivered before %s and %d attempt logs, in %d batches\n",
					res.Records, res.Cutoff.UTC().Format("2006-01-02 15:04:05Z"), res.Logs, res.Batches)
				return nil
			})
		},
	}
}
