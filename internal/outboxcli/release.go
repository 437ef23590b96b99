package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

func releaseCommand() *cli.Command {
	return &cli.Command{
		Name:      "release",
		Usage:     "Unblock an ordering key held by a FAILED row (ORDER_ON_FAILED=block) and release the next row of the key",
		UsageText: "forwarder outbox release (--key K | --id N) [--dry-run] [--operator O]",
		Description: `With ORDER_ON_FAILED=block a berth's event that ends FAILED holds its
ordering key (parkCode/berthCode): the later events of the berth wait behind
it. release gives up on the FAILED row: it stays FAILED (never sent again)
but no longer holds the key, and the next held row of the key (the earliest
persisted) is due at once, with an ORDER_RELEASED attempt log naming the
operator. To send the FAILED row again instead, in its place at the head of
the key, requeue it: forwarder outbox requeue --key <its message key> (with
--include-rejected when the platform refused it, errcode 998).

--key names the ordering key, as "outbox stats" lists blocked keys; --id the
FAILED row. The release is one transaction, safe while the service runs, and
leaves a row in forward_operator_log. --dry-run prints what it would do and
changes nothing. It fails when nothing blocks the key.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "key", Usage: "the blocked ordering key (parkCode/berthCode)"},
			&cli.Int64Flag{Name: "id", Usage: "the id of the FAILED row that blocks its key"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print what would be released"},
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			o := outboxdb.ReleaseOptions{Key: c.String("key"), ID: c.Int64("id"), Operator: operator, DryRun: c.Bool("dry-run")}
			keyErr := outboxdb.CheckText("key", o.Key)
			switch {
			case c.IsSet("key") && c.IsSet("id"):
				return refusef(c, "name the blocked key (--key) or the FAILED row (--id), not both")
			case c.IsSet("key") && o.Key == "":
				return refusef(c, "--key is empty: name the blocked key")
			case keyErr != nil:
				return refusef(c, "%v", keyErr)
			case c.IsSet("id") && o.ID <= 0:
				return refusef(c, "--id %d: want a row's id, at least 1", o.ID)
			case o.Key == "" && o.ID == 0:
				return refusef(c, "name the blocked key (--key) or the FAILED row (--id)")
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				res, err := outboxdb.ReleaseKey(ctx, pool, o)
				if errors.Is(err, outboxdb.ErrNotBlocked) {
					return fmt.Errorf("%w (outbox stats lists the blocked keys)", err)
				}
				if err != nil {
					return err
				}
				writeRelease(c.App.Writer, res, o.DryRun)
				return nil
			})
		},
	}
}

func writeRelease(w io.Writer, r outboxdb.KeyRelease, dry bool) {
	would, is := "", "is "
	if dry {
		would, is = "would be ", "would be "
	}
	ids := make([]string, len(r.Unblocked))
	for i, id := range r.Unblocked {
		ids[i] = fmt.Sprint(id)
	}
	row, stays := "row", "it stays"
	if len(ids) > 1 {
		row, stays = "rows", "they stay"
	}
	fmt.Fprintf(w, "ordering key %s: FAILED %s %s %sreleased (%s FAILED)\n", console.SafeLine(r.Key), row, strings.Join(ids, ", "), would, stays)
	switch {
	case r.Promoted != 0:
		fmt.Fprintf(w, "row %d %sdue now, next in the key\n", r.Promoted, is)
	case r.StillHeld:
		fmt.Fprintln(w, "the key is still held by another row; nothing else changes")
	default:
		fmt.Fprintln(w, "no row was waiting behind it")
	}
	if dry {
		fmt.Fprintln(w, "(dry run, nothing changed)")
	}
}
