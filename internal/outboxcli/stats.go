package outboxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "Show rows by status, the oldest undelivered row, and the top failure reasons and platform errcodes",
		Description: `Reads the outbox in one consistent snapshot. The oldest undelivered row is
the oldest PENDING or IN_PROGRESS row by created_at. Failure reasons are the
last_error of FAILED rows; a FAILED row's errcode is the platform_errcode of
its latest attempt log ("(none)" for mapping errors, timeouts and HTTP errors).
Ordering: the rows held behind an earlier row of their berth (they count in
PENDING) and the berths blocked by a FAILED row (ORDER_ON_FAILED=block),
longest blocked first, with the row to release or requeue.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "top", Value: 10, Usage: "how many failure reasons and errcodes to list"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of text"},
		},
		Action: func(c *cli.Context) error {
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				st, err := outboxdb.ReadStats(ctx, pool, c.Int("top"))
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return writeStatsJSON(c.App.Writer, st)
				}
				writeStats(c.App.Writer, st)
				return nil
			})
		},
	}
}

var statusOrder = []outboxdb.Status{outboxdb.StatusPending, outboxdb.StatusInProgress, outboxdb.StatusSuccess, outboxdb.StatusFailed}

func writeStats(w io.Writer, st outboxdb.Stats) {
	fmt.Fprintln(w, "rows by status:")
	for _, s := range statusOrder {
		fmt.Fprintf(w, "  %-12s %10d\n", s, st.Rows[s])
	}
	fmt.Fprintf(w, "  %-12s %10d\n", "total", st.Total)
	if st.Oldest == nil {
		fmt.Fprintln(w, "oldest undelivered row: none")
	} else {
		o := st.Oldest
		fmt.Fprintf(w, "oldest undelivered row: %s old (id %d, key %s, %s, created %s)\n",
			outboxdb.FormatDuration(o.Age), o.ID, o.MessageKey, o.Status, o.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"))
	}
	writeOrdering(w, st.Ordering)
	writeTop(w, "top failure reasons (FAILED rows, last_error)", st.FailureReasons)
	writeTop(w, "top platform errcodes (FAILED rows, latest attempt)", st.FailureErrcodes)
}

func writeTop(w io.Writer, title string, vs []outboxdb.ValueCount) {
	if len(vs) == 0 {
		fmt.Fprintf(w, "%s: none\n", title)
		return
	}
	fmt.Fprintf(w, "%s:\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range vs {
		value := v.Value
		if value == "" {
			value = "(none)"
		}
		fmt.Fprintf(tw, "  %d\t%s\n", v.Rows, value)
	}
	_ = tw.Flush()
}

// writeOrdering prints the rows held behind an earlier row of their berth
// and the berths blocked by a FAILED row (ORDER_ON_FAILED=block), longest
// blocked first, with what unblocks them.
func writeOrdering(w io.Writer, o outboxdb.OrderingStats) {
	fmt.Fprintf(w, "ordering: %d rows held behind an earlier row of their key (counted in PENDING), %d keys blocked by a FAILED row\n",
		o.HeldRows, o.BlockedKeys)
	if len(o.Blocked) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  blocked key\tFAILED row\tmessage key\tblocked for\theld\tlast error")
	for _, b := range o.Blocked {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%s\n", b.Key, b.ID, b.MessageKey, outboxdb.FormatDuration(b.Age), b.Held,
			outboxdb.CleanText(b.LastError, 80))
	}
	_ = tw.Flush()
	if int64(len(o.Blocked)) < o.BlockedKeys {
		fmt.Fprintf(w, "  ... and %d more\n", o.BlockedKeys-int64(len(o.Blocked)))
	}
	fmt.Fprintln(w, "  unblock with: forwarder outbox release --key K (skip the FAILED row) or forwarder outbox requeue --key <message key> [--include-rejected] (send it again)")
}

type statsJSON struct {
	Rows            map[outboxdb.Status]int64 `json:"rows"`
	Total           int64                     `json:"total"`
	Oldest          *oldestJSON               `json:"oldest_undelivered"`
	FailureReasons  []valueCountJSON          `json:"failure_reasons"`
	FailureErrcodes []valueCountJSON          `json:"failure_errcodes"`
	Ordering        orderingJSON              `json:"ordering"`
}

type orderingJSON struct {
	HeldRows    int64            `json:"held_rows"`
	BlockedKeys int64            `json:"blocked_keys"`
	Blocked     []blockedKeyJSON `json:"blocked"`
}

type blockedKeyJSON struct {
	Key        string  `json:"ordering_key"`
	ID         int64   `json:"id"`
	MessageKey string  `json:"message_key"`
	AgeSeconds float64 `json:"blocked_seconds"`
	Held       int64   `json:"held_rows"`
	LastError  string  `json:"last_error"`
}

type oldestJSON struct {
	ID         int64   `json:"id"`
	MessageKey string  `json:"message_key"`
	Status     string  `json:"status"`
	CreatedAt  string  `json:"created_at"`
	AgeSeconds float64 `json:"age_seconds"`
}

type valueCountJSON struct {
	Value string `json:"value"`
	Rows  int64  `json:"rows"`
}

func writeStatsJSON(w io.Writer, st outboxdb.Stats) error {
	out := statsJSON{Rows: st.Rows, Total: st.Total, FailureReasons: []valueCountJSON{}, FailureErrcodes: []valueCountJSON{}}
	if o := st.Oldest; o != nil {
		out.Oldest = &oldestJSON{ID: o.ID, MessageKey: o.MessageKey, Status: string(o.Status),
			CreatedAt: o.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z"), AgeSeconds: o.Age.Seconds()}
	}
	for _, v := range st.FailureReasons {
		out.FailureReasons = append(out.FailureReasons, valueCountJSON(v))
	}
	for _, v := range st.FailureErrcodes {
		out.FailureErrcodes = append(out.FailureErrcodes, valueCountJSON(v))
	}
	out.Ordering = orderingJSON{HeldRows: st.Ordering.HeldRows, BlockedKeys: st.Ordering.BlockedKeys, Blocked: []blockedKeyJSON{}}
	for _, b := range st.Ordering.Blocked {
		out.Ordering.Blocked = append(out.Ordering.Blocked, blockedKeyJSON{Key: b.Key, ID: b.ID, MessageKey: b.MessageKey,
			AgeSeconds: b.Age.Seconds(), Held: b.Held, LastError: b.LastError})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
