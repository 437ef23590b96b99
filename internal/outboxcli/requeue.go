package outboxcli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func requeueCommand() *cli.Command {
	return &cli.Command{
		Name:      "requeue",
		Usage:     "Set matching rows (FAILED unless --status says otherwise) back to PENDING, due now, with attempt_count 0",
		UsageText: "forwarder outbox requeue [--status FAILED] [--errcode E] [--since D] [--key K]... [--dry-run]",
		Description: `Filters combine with AND. Each requeued row gets one forward_retry_logs row
with result_status REQUEUED, written in the same transaction; the running
dispatchers are notified and pick the rows up at once. Rows are changed in
batches of --batch-size, one transaction each.

--status takes a comma-separated list of PENDING, IN_PROGRESS, SUCCESS and
FAILED. IN_PROGRESS rows are requeued only once their claim lease has
expired: a live holder may be talking to the platform, and its result would
race the requeue (its late result write is fenced out either way). SUCCESS
re-sends delivered messages; the platform normally answers "duplicate".

--errcode matches the platform_errcode of the row's latest attempt log
(LEASE_EXPIRED and REQUEUED rows aside); --since D keeps rows updated within
the last D (durations: Go syntax plus days, e.g. 7d, 36h, 90m).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "status", Value: "FAILED", Usage: "statuses to requeue, comma-separated"},
			&cli.StringFlag{Name: "errcode", Usage: "only rows whose latest attempt got this platform errcode"},
			&cli.StringFlag{Name: "since", Usage: "only rows updated within this long (e.g. 12h, 2d)"},
			&cli.StringSliceFlag{Name: "key", Usage: "only rows with this message key (repeatable)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print how many rows match"},
			&cli.IntFlag{Name: "batch-size", Value: outboxdb.DefaultAdminBatchSize, Usage: "rows per transaction"},
		},
		Action: func(c *cli.Context) error {
			f, err := requeueFilter(c)
			if err != nil {
				return cli.Exit(fmt.Sprintf("outbox requeue: %v", err), 2)
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				if c.Bool("dry-run") {
					n, err := outboxdb.CountRequeue(ctx, pool, f)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%d rows would be requeued (dry run, nothing changed)\n", n)
					return nil
				}
				n, err := outboxdb.Requeue(ctx, pool, f, outboxdb.RequeueOptions{BatchSize: c.Int("batch-size")})
				if err != nil {
					return fmt.Errorf("%d rows requeued before the error: %w", n, err)
				}
				fmt.Fprintf(c.App.Writer, "%d rows requeued\n", n)
				return nil
			})
		},
	}
}

func requeueFilter(c *cli.Context) (outboxdb.RequeueFilter, error) {
	var f outboxdb.RequeueFilter
	for _, s := range strings.Split(c.String("status"), ",") {
		s = strings.ToUpper(strings.TrimSpace(s))
		switch st := outboxdb.Status(s); st {
		case outboxdb.StatusPending, outboxdb.StatusInProgress, outboxdb.StatusSuccess, outboxdb.StatusFailed:
			f.Statuses = append(f.Statuses, st)
		default:
			return f, fmt.Errorf("--status %q: want PENDING, IN_PROGRESS, SUCCESS or FAILED (comma-separated)", s)
		}
	}
	if c.IsSet("errcode") {
		e := c.String("errcode")
		f.Errcode = &e
	}
	if c.IsSet("since") {
		d, err := outboxdb.ParseDuration(c.String("since"))
		if err != nil {
			return f, fmt.Errorf("--since: %w", err)
		}
		if d == 0 {
			return f, fmt.Errorf("--since 0 would match nothing; leave it out to match any age")
		}
		f.UpdatedWithin = d
	}
	f.Keys = c.StringSlice("key")
	if c.Int("batch-size") <= 0 {
		return f, fmt.Errorf("--batch-size must be positive")
	}
	return f, nil
}
