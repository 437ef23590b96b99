package outboxcli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
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
longest blocked first, with the row to release or requeue.
Platform: the circuit breaker every instance shares (CLOSED: sending; OPEN:
only probes; HALF_OPEN: ramping up after a probe succeeded) and any pause a
Retry-After asked for; delivery paused by an operator (outbox pause), by
whom, why and until when, or the last pause. Rows FAILED on transient errors: those automatic
requeue will still take, and the frozen ones whose rounds are used up.`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "top", Value: 10, Usage: "how many failure reasons and errcodes to list"},
			&cli.IntFlag{Name: "requeue-rounds", Value: 3, EnvVars: []string{"FAILED_REQUEUE_ROUNDS"},
				Usage: "automatic requeues a row gets, as the service is configured: splits waiting rows from frozen ones"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of text"},
		},
		Action: func(c *cli.Context) error {
			if top := c.Int("top"); top < 1 {
				// outboxdb reads 0 as its default, 10: --top 0 would list ten.
				return refusef(c, "--top %d: want at least 1", top)
			}
			if r := c.Int("requeue-rounds"); r < 0 || r > outboxdb.MaxRequeueRounds {
				return refusef(c, "--requeue-rounds %d (FAILED_REQUEUE_ROUNDS): want 0 to %d", r, outboxdb.MaxRequeueRounds)
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				st, err := outboxdb.ReadStats(ctx, pool, outboxdb.StatsOptions{Top: c.Int("top"), RequeueRounds: c.Int("requeue-rounds")})
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
			age(o.Age), o.ID, console.SafeLine(o.MessageKey), o.Status, o.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"))
	}
	writePlatform(w, st.Platform)
	fmt.Fprintf(w, "failed on transient errors: %d waiting for automatic requeue, %d frozen (requeue rounds used up)\n",
		st.Compensation.Waiting, st.Compensation.Frozen)
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
		value := console.SafeLine(v.Value)
		if value == "" {
			value = "(none)"
		}
		fmt.Fprintf(tw, "  %d\t%s\n", v.Rows, value)
	}
	_ = tw.Flush()
}

// age is a duration as stats prints every one: to the second ("0s" below
// one), in ParseDuration's syntax.
func age(d time.Duration) string { return outboxdb.FormatDuration(max(0, d).Round(time.Second)) }

// writePlatform prints the shared breaker state and any pause, with times
// relative to the database clock.
func writePlatform(w io.Writer, p outboxdb.PlatformState) {
	since := age
	fmt.Fprintf(w, "platform: breaker %s for %s", p.Breaker, since(p.Now.Sub(p.ChangedAt)))
	if p.Reason != "" {
		fmt.Fprintf(w, " (%s)", console.SafeLine(outboxdb.CleanText(p.Reason, 120)))
	}
	if p.Breaker == "OPEN" {
		fmt.Fprintf(w, ", next probe in %s", since(p.NextProbeAt.Sub(p.Now)))
	}
	if p.PausedUntil.After(p.Now) {
		fmt.Fprintf(w, "; sending paused for %s (Retry-After)", since(p.PausedUntil.Sub(p.Now)))
	}
	fmt.Fprintln(w)
	writeDeliveryPause(w, p.Pause, p.Now)
}

// writeDeliveryPause prints the operator's pause in force, or the last one.
func writeDeliveryPause(w io.Writer, p outboxdb.DeliveryPause, now time.Time) {
	switch {
	case p.Since.IsZero():
		fmt.Fprintln(w, "delivery: not paused")
		return
	case p.InForce:
		fmt.Fprintf(w, "delivery: PAUSED by %s for %s", console.SafeLine(p.By), age(now.Sub(p.Since)))
		if p.Until.IsZero() {
			fmt.Fprint(w, ", until resumed (outbox resume)")
		} else {
			fmt.Fprintf(w, ", until %s (in %s)", p.Until.UTC().Format(time.RFC3339), age(p.Until.Sub(now)))
		}
	default:
		fmt.Fprintf(w, "delivery: not paused (the last pause, by %s, ended %s ago)", console.SafeLine(p.By), age(now.Sub(p.Until)))
	}
	if p.Reason != "" {
		fmt.Fprintf(w, ": %s", console.SafeLine(outboxdb.CleanText(p.Reason, 120)))
	}
	fmt.Fprintln(w)
}

// writeOrdering prints the rows held behind an earlier row of their berth
// and the berths blocked by a FAILED row (ORDER_ON_FAILED=block), longest
// blocked first, with what unblocks them.
func writeOrdering(w io.Writer, o outboxdb.OrderingStats) {
	fmt.Fprintf(w, "ordering: %s held behind an earlier row of their key (counted in PENDING), %s blocked by a FAILED row\n",
		plural.Count(o.HeldRows, "row", "rows"), plural.Count(o.BlockedKeys, "key", "keys"))
	if len(o.Blocked) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  blocked key\tFAILED row\tmessage key\tblocked for\theld\tlast error")
	for _, b := range o.Blocked {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%s\n", console.SafeLine(b.Key), b.ID, console.SafeLine(b.MessageKey),
			age(b.Age), b.Held, console.SafeLine(outboxdb.CleanText(b.LastError, 80)))
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
	Platform        platformJSON              `json:"platform"`
	Compensation    compensationJSON          `json:"failed_transient"`
}

type platformJSON struct {
	Breaker     string     `json:"breaker"`
	Since       time.Time  `json:"since"`
	Reason      string     `json:"reason"`
	NextProbeAt *time.Time `json:"next_probe_at"`
	PausedUntil *time.Time `json:"paused_until"`
	// Pause is the operator's pause in force, null when none is.
	Pause *pauseJSON `json:"delivery_pause"`
}

type pauseJSON struct {
	Since  time.Time  `json:"since"`
	Until  *time.Time `json:"until"`
	By     string     `json:"by"`
	Reason string     `json:"reason"`
}

type compensationJSON struct {
	Waiting int64 `json:"waiting_requeue"`
	Frozen  int64 `json:"frozen"`
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
	p := st.Platform
	out.Platform = platformJSON{Breaker: p.Breaker, Since: p.ChangedAt.UTC(), Reason: p.Reason}
	if p.Breaker == "OPEN" {
		at := p.NextProbeAt.UTC()
		out.Platform.NextProbeAt = &at
	}
	if p.PausedUntil.After(p.Now) {
		until := p.PausedUntil.UTC()
		out.Platform.PausedUntil = &until
	}
	if p.Pause.InForce {
		out.Platform.Pause = &pauseJSON{Since: p.Pause.Since.UTC(), By: p.Pause.By, Reason: p.Pause.Reason}
		if !p.Pause.Until.IsZero() {
			until := p.Pause.Until.UTC()
			out.Platform.Pause.Until = &until
		}
	}
	out.Compensation = compensationJSON{Waiting: st.Compensation.Waiting, Frozen: st.Compensation.Frozen}
	return writeJSON(w, out, true)
}
