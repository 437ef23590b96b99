package outboxcli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

func findCommand() *cli.Command {
	return &cli.Command{
		Name:  "find",
		Usage: "List rows by plate, park, berth, device, status, errcode or time, newest first",
		UsageText: "forwarder outbox find [--plate P] [--park P] [--berth B] [--device D] [--status S] [--errcode E]\n" +
			"   [--since T] [--until T] [--limit N] [--json] [--explain] [--timeout D]",
		Description: `Filters combine with AND; one given empty is refused (exit status
2) rather than read as no filter. Every search walks one index (the most
selective filter given picks it) and stops at --limit rows (default 50, at
most 1000); it never reads the whole table. Rows come newest first: by id, or by last
change when only --status (other than SUCCESS) narrows the search.

--errcode E keeps rows whose latest attempt got platform errcode E (as in
outbox stats). --since and --until bound created_at: a duration back from
now (2h, 7d) or a time (2026-05-21, "2026-05-21 10:30", RFC 3339; times
without a zone are UTC).

Default output is a table; --json prints one JSON object per row. --explain
prints the query plan instead (which index the search uses on this database).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plate", Usage: "plate number (plateNo)"},
			&cli.StringFlag{Name: "park", Usage: "park code (parkCode)"},
			&cli.StringFlag{Name: "berth", Usage: "berth code (berthCode)"},
			&cli.StringFlag{Name: "device", Usage: "device id (deviceId)"},
			&cli.StringFlag{Name: "status", Usage: "PENDING, IN_PROGRESS, SUCCESS or FAILED"},
			&cli.StringFlag{Name: "errcode", Usage: "platform errcode of the latest attempt"},
			&cli.StringFlag{Name: "since", Usage: "created at or after: a duration back from now (2h, 7d) or a time"},
			&cli.StringFlag{Name: "until", Usage: "created before: a duration back from now or a time"},
			&cli.IntFlag{Name: "limit", Value: outboxdb.DefaultFindLimit, Usage: fmt.Sprintf("rows at most (1 to %d)", outboxdb.MaxFindLimit)},
			&cli.BoolFlag{Name: "json", Usage: "one JSON object per line"},
			&cli.BoolFlag{Name: "explain", Usage: "print the query plan (EXPLAIN, JSON) instead of rows"},
			timeoutFlag(),
		},
		Action: func(c *cli.Context) error {
			f, err := findFilter(c, time.Now())
			if err != nil {
				return cli.Exit(fmt.Sprintf("outbox find: %v", err), 2)
			}
			timeout, err := lookupTimeout(c)
			if err != nil {
				return err
			}
			opts := outboxdb.LookupOptions{Timeout: timeout}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				if c.Bool("explain") {
					plan, err := outboxdb.ExplainFind(ctx, pool, f, opts)
					if err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, plan)
					return nil
				}
				rows, err := outboxdb.Find(ctx, pool, f, opts)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return writeFindJSON(c.App.Writer, rows)
				}
				writeFind(c.App.Writer, rows, f)
				return nil
			})
		},
	}
}

// findFilterFlags are the flags of find that filter; an empty value
// filters nothing.
var findFilterFlags = []string{"plate", "park", "berth", "device", "status", "errcode", "since", "until"}

func findFilter(c *cli.Context, now time.Time) (outboxdb.FindFilter, error) {
	// Given empty (a script's unset variable), a filter would filter
	// nothing, and every row would be listed as if it matched.
	for _, name := range findFilterFlags {
		if c.IsSet(name) && c.String(name) == "" {
			return outboxdb.FindFilter{}, fmt.Errorf("--%s is empty: leave the flag out not to filter on it", name)
		}
	}
	f := outboxdb.FindFilter{
		Plate: c.String("plate"), Park: c.String("park"), Berth: c.String("berth"), Device: c.String("device"),
		Status: outboxdb.Status(strings.ToUpper(c.String("status"))), Errcode: c.String("errcode"), Limit: c.Int("limit"),
	}
	if c.Int("limit") < 1 || c.Int("limit") > outboxdb.MaxFindLimit {
		return f, fmt.Errorf("--limit %d: want 1 to %d", c.Int("limit"), outboxdb.MaxFindLimit)
	}
	var err error
	if f.Since, err = console.ParseWhen(c.String("since"), now); err != nil {
		return f, fmt.Errorf("--since: %w", err)
	}
	if f.Until, err = console.ParseWhen(c.String("until"), now); err != nil {
		return f, fmt.Errorf("--until: %w", err)
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

func cut(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func writeFind(w io.Writer, rows []outboxdb.FoundRow, f outboxdb.FindFilter) {
	if len(rows) == 0 {
		fmt.Fprintf(w, "no rows match %s\n", f)
		return
	}
	table := [][]string{{"ID", "CREATED", "STATUS", "ATTEMPTS", "ERRCODE", "API_TYPE", "PLATE", "PARK", "BERTH", "DEVICE", "MESSAGE_KEY", "LAST_ERROR"}}
	for _, r := range rows {
		status := string(r.Status)
		if r.FailureClass != nil {
			status += "/" + *r.FailureClass
		}
		if r.OrderHeld {
			status += " (held)"
		}
		table = append(table, []string{strconv.FormatInt(r.ID, 10), r.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"),
			status, strconv.Itoa(r.AttemptCount), str(r.LastErrcode), console.SafeLine(r.APIType), str(r.PlateNo), str(r.ParkCode),
			str(r.BerthCode), str(r.DeviceID), console.SafeLine(r.MessageKey), cut(str(r.LastError), 60)})
	}
	// Padded by display width: plates hold Chinese characters.
	_ = writeTable(w, table, 2)
	if len(rows) == f.Limit || (f.Limit == 0 && len(rows) == outboxdb.DefaultFindLimit) {
		fmt.Fprintf(w, "(%s shown, there may be more: --limit raises the cap, up to %d)\n", plural(len(rows), "row", "rows"), outboxdb.MaxFindLimit)
	}
}

// findRowJSON is one line of `outbox find --json`: the columns the search
// reads (lookup_find.sql), no more. Printed whole, a FoundRow added the
// columns of the record it did not read, as zero values: a FAILED row's
// failed_at null, partition 0, offset 0 of topic "".
type findRowJSON struct {
	rowJSON
	LastErrcode *string `json:"last_errcode"`
}

func writeFindJSON(w io.Writer, rows []outboxdb.FoundRow) error {
	for _, r := range rows {
		out := findRowJSON{rowJSON: newRowJSON(r.Record), LastErrcode: r.LastErrcode}
		if err := writeJSON(w, out, false); err != nil {
			return err
		}
	}
	return nil
}
