package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

func requeueCommand() *cli.Command {
	return &cli.Command{
		Name:      "requeue",
		Usage:     "Set matching rows (FAILED unless --status says otherwise) back to PENDING, due now, with attempt_count 0",
		UsageText: "forwarder outbox requeue [--status FAILED] [--errcode E] [--since D] [--key K]... [--include-rejected] [--include-invalid] [--force] [--operator NAME] [--dry-run] [--batch-size N]",
		Description: `Filters combine with AND. Each requeued row gets one forward_retry_logs row
with result_status REQUEUED, written in the same transaction; the running
dispatchers are notified and pick the rows up at once. Rows are changed in
batches of --batch-size, one transaction each.

--status takes a comma-separated list of PENDING, IN_PROGRESS, SUCCESS and
FAILED. IN_PROGRESS rows are requeued only once their claim lease has
expired: a live holder may be talking to the platform, and its result would
race the requeue (its late result write is fenced out either way). SUCCESS
re-sends delivered messages; the platform normally answers "duplicate".
That is why SUCCESS without --key is refused unless --force is given: it
prints how many delivered rows would be sent again and changes nothing.

A requeued berth event (ordering key) waits behind the head of its berth,
if any, and rows of one berth requeued together keep their order; a FAILED
row that blocks its berth (ORDER_ON_FAILED=block) becomes its head again.

--errcode matches the platform_errcode of the row's latest attempt log
(LEASE_EXPIRED and REQUEUED rows aside); --since D keeps rows updated within
the last D (durations: Go syntax plus days, e.g. 7d, 36h, 90m).

FAILED rows the platform refused for good (failure class REJECTED: errcode
998, "do not resend", or a no_retry rule) and rows that failed at ingest or
in their mapping (INVALID: they fail again unless the input or the mapping
was fixed) are left out unless --include-rejected / --include-invalid asks
for them; the command says how many it left out. Only rows that ran out of
attempts on transient errors (TRANSIENT) are requeued by default.

It prints what it will change (how many rows, which filter) before it
starts, and records who ran it (--operator, default $USER), the filter and
the number of rows in forward_operator_log.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "status", Value: "FAILED", Usage: "statuses to requeue, comma-separated"},
			&cli.StringFlag{Name: "errcode", Usage: "only rows whose latest attempt got this platform errcode"},
			&cli.StringFlag{Name: "since", Usage: "only rows updated within this long (e.g. 12h, 2d)"},
			&cli.GenericFlag{Name: "key", Value: &keyList{}, Usage: "only rows with this message key (repeatable)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "only print how many rows match"},
			&cli.IntFlag{Name: "batch-size", Value: outboxdb.DefaultAdminBatchSize, Usage: "rows per transaction"},
			&cli.BoolFlag{Name: "include-rejected", Usage: "also requeue FAILED rows the platform refused for good (errcode 998, no_retry rules)"},
			&cli.BoolFlag{Name: "include-invalid", Usage: "also requeue FAILED rows that failed at ingest or in their mapping"},
			&cli.BoolFlag{Name: "force", Usage: "accept --status SUCCESS without --key (delivered messages are sent again)"},
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			f, err := requeueFilter(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			desc := describeRequeue(f)
			// Delivered rows picked by a filter rather than by key: every
			// one goes to the platform again, so it takes --force, as a
			// short purge does.
			resendMany := slices.Contains(f.Statuses, outboxdb.StatusSuccess) && len(f.Keys) == 0
			if resendMany && c.Bool("force") {
				desc += " --force"
			}
			w := c.App.Writer
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				count, err := outboxdb.CountRequeue(ctx, pool, f)
				if err != nil {
					return err
				}
				delivered, err := countDelivered(ctx, pool, f)
				if err != nil {
					return err
				}
				if c.Bool("dry-run") {
					fmt.Fprintf(w, "%s would be requeued (dry run, nothing changed): %s\n", plural.Count(count.Rows, "row", "rows"), desc)
					writeLeftOut(w, count)
					writeDelivered(w, delivered, "would be")
					return nil
				}
				if resendMany && !c.Bool("force") {
					fmt.Fprintf(w, "%s would be requeued: %s\n", plural.Count(count.Rows, "row", "rows"), desc)
					writeDelivered(w, delivered, "would be")
					return refusef(c, "--status SUCCESS without --key would send %s "+
						"to the platform again; nothing changed. Add --force to do it, or name the rows with --key.",
						plural.Count(delivered, "delivered message", "delivered messages"))
				}
				fmt.Fprintf(w, "requeueing %s: %s (operator %s)\n", plural.Count(count.Rows, "row", "rows"), desc, console.SafeLine(operator))
				writeLeftOut(w, count)
				writeDelivered(w, delivered, "will be")
				n, err := outboxdb.Requeue(ctx, pool, f, outboxdb.RequeueOptions{
					BatchSize: c.Int("batch-size"), Note: "requeued by " + operator})
				// Recorded whatever happened: the batches before an error stay.
				if _, auditErr := outboxdb.LogOperatorAction(context.WithoutCancel(ctx), pool, outboxdb.OperatorAction{
					Operator: operator, Action: outboxdb.ActionRequeue, Filter: desc, Rows: n}); auditErr != nil {
					err = errors.Join(err, auditErr)
				}
				if err != nil {
					return fmt.Errorf("%s requeued before the error: %w", plural.Count(n, "row", "rows"), err)
				}
				fmt.Fprintf(w, "%s requeued\n", plural.Count(n, "row", "rows"))
				return nil
			})
		},
	}
}

// keyList is the value of --key: one key each time the flag is given, taken
// whole. A StringSliceFlag splits its values at commas, and a message key is
// the camera's messageId, which may hold one: --key "a,b" named the rows "a"
// and "b".
type keyList []string

func (k *keyList) Set(v string) error {
	if v == "" {
		// A script's unset variable; no row has an empty key.
		return errors.New("a message key is never empty")
	}
	*k = append(*k, v)
	return nil
}

func (k *keyList) String() string {
	if k == nil {
		return ""
	}
	return strings.Join(*k, " ")
}

// describeRequeue says which rows a requeue takes, for people and for the
// audit log.
func describeRequeue(f outboxdb.RequeueFilter) string {
	var parts []string
	statuses := make([]string, len(f.Statuses))
	for i, s := range f.Statuses {
		statuses[i] = string(s)
	}
	if len(statuses) == 0 {
		statuses = []string{string(outboxdb.StatusFailed)}
	}
	parts = append(parts, "status="+strings.Join(statuses, ","))
	if slices.Contains(f.Statuses, outboxdb.StatusFailed) || len(f.Statuses) == 0 {
		classes := []string{string(outboxdb.ClassTransient)}
		if len(f.Classes) > 0 {
			classes = classes[:0]
		}
		for _, c := range f.Classes {
			classes = append(classes, string(c))
		}
		parts = append(parts, "failure_class="+strings.Join(classes, ","))
	}
	if f.Errcode != nil {
		parts = append(parts, "errcode="+strconv.Quote(*f.Errcode))
	}
	if f.UpdatedWithin > 0 {
		parts = append(parts, "updated within "+outboxdb.FormatDuration(f.UpdatedWithin))
	}
	if f.Reason != nil {
		parts = append(parts, "reason="+strconv.Quote(*f.Reason))
	}
	if len(f.Keys) > 0 {
		keys := make([]string, len(f.Keys))
		for i, k := range f.Keys {
			keys[i] = strconv.Quote(k)
		}
		parts = append(parts, "key="+strings.Join(keys, ","))
	}
	return strings.Join(parts, " ")
}

// countDelivered counts the SUCCESS rows among those f takes: 0 when f
// takes no SUCCESS rows.
func countDelivered(ctx context.Context, pool *pgxpool.Pool, f outboxdb.RequeueFilter) (int64, error) {
	if !slices.Contains(f.Statuses, outboxdb.StatusSuccess) {
		return 0, nil
	}
	f.Statuses = []outboxdb.Status{outboxdb.StatusSuccess}
	c, err := outboxdb.CountRequeue(ctx, pool, f)
	return c.Rows, err
}

// writeDelivered says how many of the rows were delivered already and will
// reach the platform a second time.
func writeDelivered(w io.Writer, n int64, verb string) {
	switch {
	case n == 1:
		fmt.Fprintf(w, "1 of them SUCCESS: delivered already, it %s sent to the platform again\n", verb)
	case n > 1:
		fmt.Fprintf(w, "%d of them SUCCESS: delivered already, they %s sent to the platform again\n", n, verb)
	}
}

func writeLeftOut(w io.Writer, c outboxdb.RequeueCount) {
	var left []string
	if c.LeftRejected > 0 {
		left = append(left, fmt.Sprintf("%d REJECTED by the platform (errcode 998 or a no_retry rule; --include-rejected takes them)", c.LeftRejected))
	}
	if c.LeftInvalid > 0 {
		left = append(left, fmt.Sprintf("%d INVALID (bad input or a mapping error; --include-invalid takes them)", c.LeftInvalid))
	}
	if len(left) > 0 {
		fmt.Fprintf(w, "left out: %s\n", strings.Join(left, ", "))
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
		// Given empty (a script's unset variable), it matched no row, and
		// rows without an errcode cannot be chosen by one.
		e := c.String("errcode")
		if e == "" {
			return f, errors.New("--errcode is empty: leave the flag out not to filter on it")
		}
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
	if keys, ok := c.Generic("key").(*keyList); ok {
		f.Keys = *keys
	}
	f.Classes = []outboxdb.FailureClass{outboxdb.ClassTransient}
	if c.Bool("include-rejected") {
		f.Classes = append(f.Classes, outboxdb.ClassRejected)
	}
	if c.Bool("include-invalid") {
		f.Classes = append(f.Classes, outboxdb.ClassInvalid)
	}
	if c.Int("batch-size") <= 0 {
		return f, fmt.Errorf("--batch-size must be positive")
	}
	return f, f.Validate()
}
