package outboxcli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

// The lookup commands: show and find. Both only read, in a read-only
// transaction bounded by --timeout (outboxdb.ReadOnly).

const defaultMappingsDir = "mappings"

func timeoutFlag() cli.Flag {
	return &cli.DurationFlag{Name: "timeout", Value: outboxdb.DefaultLookupTimeout,
		Usage: "statement timeout of the lookup"}
}

// lookupTimeout is --timeout, refused below a millisecond: the statement
// timeout is set in whole milliseconds, and PostgreSQL reads 0 as no timeout
// at all, so 500us made the lookup unbounded (and 0 or below would fall back
// to the default, silently).
func lookupTimeout(c *cli.Context) (time.Duration, error) {
	d := c.Duration("timeout")
	if d < time.Millisecond {
		return 0, refusef(c, "--timeout %s: want at least 1ms", d)
	}
	return d, nil
}

func showCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Usage:     "Show one row: status, Kafka origin, payload, the request the current mapping would send, and its attempts",
		UsageText: "forwarder outbox show [--mappings DIR] [--json] [--timeout D] <message_key | id>",
		Description: `The argument is a message_key; a number is tried as a message_key and as an
id (the key's row wins when both exist). Exit status 1 when no row matches.

A row held behind an earlier event of its ordering key (its berth) says which
row it waits behind ("held behind"): that row's status, attempts, next attempt
and last error, or that it is FAILED and blocks the key. While the breaker is
open or delivery is paused, an unfinished row says it is not sent for now, and
why, as "outbox stats" does.

The payload is printed as indented JSON when it is JSON; text that is not
valid UTF-8, and control characters, are printed as escapes (\xNN,
\u{NNNN}), never raw. At most 256 KiB of it is printed, objects and
arrays nested deeper than 32 levels as {…} and […], and what was left out
is said; --json has every byte in payload_base64.

The request body is what the mapping file for the row's api_type
(--mappings DIR/<api_type in lower case>.blobl, as pipelines/forwarder.yaml
names them) makes of the payload now, with "access_name" and "access_pwd"
shown as "***": the credentials are never read. Times in it follow this
shell's PLATFORM_TZ. The mapping runs only on payloads of at most 1 MiB,
and for at most 2 s.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "mappings", Value: defaultMappingsDir, Usage: "directory of the mapping files"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			timeoutFlag(),
		},
		Action: func(c *cli.Context) error {
			switch {
			case c.NArg() == 0:
				return refusef(c, "give one message_key or id")
			case c.NArg() > 1:
				// urfave/cli reads no flag after the argument: `show k --json`
				// would otherwise be refused as two keys, or not understood.
				return refusef(c, "one message_key or id, got %s: flags go before the key", quoteArgs(c.Args().Slice()))
			}
			ref := c.Args().First()
			if err := outboxdb.CheckText("message_key", ref); err != nil {
				return refusef(c, "%v", err)
			}
			timeout, err := lookupTimeout(c)
			if err != nil {
				return err
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				v, err := outboxdb.ShowRecord(ctx, pool, ref, outboxdb.LookupOptions{Timeout: timeout})
				if errors.Is(err, outboxdb.ErrNoRecord) {
					return failf(c, "no row with message_key or id %s", strconv.Quote(ref))
				}
				if err != nil {
					return err
				}
				preview := console.PreviewRequest(c.String("mappings"), v.Record)
				if c.Bool("json") {
					return writeShowJSON(c.App.Writer, v, preview)
				}
				writeShow(c.App.Writer, v, preview)
				return nil
			})
		},
	}
}

const timeFormat = "2006-01-02 15:04:05.000Z"

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(timeFormat)
}

func str(p *string) string {
	if p == nil {
		return "-"
	}
	return console.SafeLine(*p)
}

func num[T int32 | int64 | int](p *T) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(int64(*p), 10)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func writeShow(w io.Writer, v outboxdb.RecordView, preview console.Preview) {
	r := v.Record
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "row\t%d\n", r.ID)
	fmt.Fprintf(tw, "message_key\t%s\n", console.SafeLine(r.MessageKey))
	fmt.Fprintf(tw, "api_type\t%s\n", console.SafeLine(r.APIType))
	status := string(r.Status)
	if r.FailureClass != nil {
		status += " (" + *r.FailureClass + ")"
	}
	fmt.Fprintf(tw, "status\t%s\n", status)
	fmt.Fprintf(tw, "attempts\t%d\n", r.AttemptCount)
	fmt.Fprintf(tw, "next_retry_at\t%s\n", fmtTime(r.NextRetryAt))
	fmt.Fprintf(tw, "last error\t%s\n", str(r.LastError))
	fmt.Fprintf(tw, "last http status\t%s\n", num(r.LastHTTPStatus))
	fmt.Fprintf(tw, "created\t%s\n", fmtTime(&r.CreatedAt))
	fmt.Fprintf(tw, "updated\t%s\n", fmtTime(&r.UpdatedAt))
	fmt.Fprintf(tw, "delivered\t%s\n", fmtTime(r.SucceededAt))
	if r.Status == outboxdb.StatusFailed {
		fmt.Fprintf(tw, "failed\t%s (automatic requeues so far: %d)\n", fmtTime(r.FailedAt), r.RequeueRounds)
	}
	if r.ClaimedBy != nil {
		fmt.Fprintf(tw, "claimed by\t%s at %s\n", str(r.ClaimedBy), fmtTime(r.ClaimedAt))
	}
	fmt.Fprintf(tw, "ordering key\t%s (held: %s, blocking its key: %s)\n", str(r.OrderingKey), yesNo(r.OrderHeld), yesNo(r.OrderBlocked))
	if h := v.HeldBehind; h != nil {
		fmt.Fprintf(tw, "held behind\t%s\n", holderLine(h))
	}
	fmt.Fprintf(tw, "plate / park / berth / device\t%s / %s / %s / %s\n", str(r.PlateNo), str(r.ParkCode), str(r.BerthCode), str(r.DeviceID))
	kafkaKey := "(none)"
	if r.KafkaKey != nil {
		kafkaKey = strconv.Quote(console.SafeBytes(r.KafkaKey))
	}
	fmt.Fprintf(tw, "kafka\ttopic %s, partition %d, offset %d, key %s\n", console.SafeLine(r.KafkaTopic), r.KafkaPartition, r.KafkaOffset, kafkaKey)
	if r.DeadLetteredAt != nil {
		fmt.Fprintf(tw, "dead-lettered\t%s\n", fmtTime(r.DeadLetteredAt))
	}
	_ = tw.Flush()
	if p := v.Platform; p != nil && p.Stopped() {
		fmt.Fprintln(w, "not sent for now, like every unfinished row:")
		writePlatform(w, *p)
	}
	if v.OtherID != nil {
		fmt.Fprintf(w, "(row %d has this number as its id: forwarder outbox show does not look it up while a key matches)\n", *v.OtherID)
	}

	// Bounded whatever the payload (docs/guarantees.md, "bounded
	// rendering"); --json has the exact bytes.
	p := console.RenderPayload(r.Payload, console.PayloadLimit)
	fmt.Fprintln(w)
	switch p.Kind {
	case "empty":
		fmt.Fprintln(w, "payload: empty")
	case "binary":
		fmt.Fprintf(w, "payload (%d bytes, not valid UTF-8 from offset %d; escaped):\n%s\n", p.Size, p.BadOffset, p.Text)
	case "json":
		fmt.Fprintf(w, "payload (%d bytes, JSON, indented):\n%s\n", p.Size, p.Text)
	default:
		fmt.Fprintf(w, "payload (%d bytes, not JSON):\n%s\n", p.Size, p.Text)
	}
	if notes := p.Notes(); len(notes) > 0 {
		fmt.Fprintf(w, "%s (--json has every byte, as payload_base64)\n", strings.Join(notes, " "))
	}

	fmt.Fprintln(w)
	mappingFile := console.SafeLine(preview.Mapping) // named after the stored api_type
	if preview.Err != "" {
		fmt.Fprintf(w, "request body (%s): none: %s\n", mappingFile, preview.Err)
	} else {
		fmt.Fprintf(w, "request body the current mapping would send (%s, credentials masked):\n%s\n", mappingFile, preview.Body)
		if len(preview.Notes) > 0 {
			fmt.Fprintln(w, strings.Join(preview.Notes, " "))
		}
	}

	fmt.Fprintln(w)
	if v.AttemptsTotal == 0 {
		fmt.Fprintln(w, "attempts: none")
		return
	}
	if int64(len(v.Attempts)) < v.AttemptsTotal {
		fmt.Fprintf(w, "attempts (%d, the latest %d shown):\n", v.AttemptsTotal, len(v.Attempts))
	} else {
		fmt.Fprintf(w, "attempts (%d):\n", v.AttemptsTotal)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT\t#\tRESULT\tHTTP\tERRCODE\tMS\tNEXT RETRY\tERROR")
	for _, a := range v.Attempts {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.AttemptedAt.UTC().Format(timeFormat), a.AttemptNumber,
			console.SafeLine(a.ResultStatus), num(a.HTTPStatus), str(a.PlatformErrcode), num(a.DurationMS),
			fmtTime(a.NextRetryAt), str(a.ErrorMessage))
	}
	_ = tw.Flush()
}

// holderLine says what a held row waits for: the row ahead of it, and what
// that row waits for in turn.
func holderLine(h *outboxdb.Holder) string {
	line := fmt.Sprintf("row %d (message_key %s): %s, %s", h.ID, console.SafeLine(h.MessageKey), h.Status, plural.Count(h.AttemptCount, "attempt", "attempts"))
	switch {
	case h.Blocking:
		line += fmt.Sprintf(", blocking its key (ORDER_ON_FAILED=block; forwarder outbox release --id %d lets the key go on)", h.ID)
	case h.Status == outboxdb.StatusPending:
		line += ", next attempt at " + fmtTime(h.NextRetryAt)
	}
	if h.LastError != nil {
		line += ", last error: " + str(h.LastError)
	}
	if h.HeldBefore > 0 {
		line += fmt.Sprintf("; then %d more of the key before this one", h.HeldBefore)
	}
	return line
}

// rowJSON is the columns of a row that `outbox show --json` and `outbox find
// --json` both print, in that order; each adds its own after them.
type rowJSON struct {
	ID             int64           `json:"id"`
	MessageKey     string          `json:"message_key"`
	APIType        string          `json:"api_type"`
	Status         outboxdb.Status `json:"status"`
	FailureClass   *string         `json:"failure_class"`
	AttemptCount   int             `json:"attempt_count"`
	LastError      *string         `json:"last_error"`
	LastHTTPStatus *int32          `json:"last_http_status"`
	PlateNo        *string         `json:"plate_no"`
	ParkCode       *string         `json:"park_code"`
	BerthCode      *string         `json:"berth_code"`
	DeviceID       *string         `json:"device_id"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	NextRetryAt    *time.Time      `json:"next_retry_at"`
	SucceededAt    *time.Time      `json:"succeeded_at"`
	OrderingKey    *string         `json:"ordering_key"`
	OrderHeld      bool            `json:"order_held"`
	OrderBlocked   bool            `json:"order_blocked"`
}

func newRowJSON(r outboxdb.Record) rowJSON {
	return rowJSON{ID: r.ID, MessageKey: r.MessageKey, APIType: r.APIType, Status: r.Status,
		FailureClass: r.FailureClass, AttemptCount: r.AttemptCount, LastError: r.LastError,
		LastHTTPStatus: r.LastHTTPStatus, PlateNo: r.PlateNo, ParkCode: r.ParkCode, BerthCode: r.BerthCode,
		DeviceID: r.DeviceID, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, NextRetryAt: r.NextRetryAt,
		SucceededAt: r.SucceededAt, OrderingKey: r.OrderingKey, OrderHeld: r.OrderHeld, OrderBlocked: r.OrderBlocked}
}

// showJSON is `outbox show --json`. The payload is there as base64 (exact
// bytes) and, when it is JSON, as the JSON value itself.
type showJSON struct {
	rowJSON
	FailedAt       *time.Time         `json:"failed_at"`
	RequeueRounds  int                `json:"requeue_rounds"`
	KafkaTopic     string             `json:"kafka_topic"`
	KafkaPartition int32              `json:"kafka_partition"`
	KafkaOffset    int64              `json:"kafka_offset"`
	KafkaKeyBase64 *string            `json:"kafka_key_base64"`
	PayloadBase64  []byte             `json:"payload_base64"` // encoding/json writes []byte as base64
	Payload        json.RawMessage    `json:"payload,omitempty"`
	PayloadOmitted string             `json:"payload_omitted,omitempty"`
	Request        json.RawMessage    `json:"request,omitempty"`
	RequestError   string             `json:"request_error,omitempty"`
	Mapping        string             `json:"mapping"`
	AttemptsTotal  int64              `json:"attempts_total"`
	Attempts       []outboxdb.Attempt `json:"attempts"`
	HeldBehind     *outboxdb.Holder   `json:"held_behind,omitempty"`
}

func writeShowJSON(w io.Writer, v outboxdb.RecordView, preview console.Preview) error {
	r := v.Record
	out := showJSON{rowJSON: newRowJSON(r), FailedAt: r.FailedAt, RequeueRounds: r.RequeueRounds,
		KafkaTopic: r.KafkaTopic, KafkaPartition: r.KafkaPartition, KafkaOffset: r.KafkaOffset,
		PayloadBase64: r.Payload, Mapping: preview.Mapping,
		RequestError: preview.Err, AttemptsTotal: v.AttemptsTotal, Attempts: v.Attempts, HeldBehind: v.HeldBehind}
	if r.KafkaKey != nil {
		k := base64.StdEncoding.EncodeToString(r.KafkaKey)
		out.KafkaKeyBase64 = &k
	}
	// The payload as a JSON value only while it indents within the
	// bounds of the text output: the encoder indents it again, and a
	// deeply nested payload indents to gigabytes.
	if p := console.RenderPayload(r.Payload, console.PayloadLimit); p.Kind == "json" {
		if notes := p.Notes(); len(notes) == 0 {
			out.Payload = r.Payload
		} else {
			out.PayloadOmitted = "payload_base64 holds it; as JSON it is too large to show: " + strings.Join(notes, " ")
		}
	}
	switch {
	case preview.JSON != nil:
		out.Request = preview.JSON
	case preview.Body != "":
		out.RequestError = "the request body is too large to show: " + strings.Join(preview.Notes, " ")
	}
	if out.Attempts == nil {
		out.Attempts = []outboxdb.Attempt{} // [] rather than null
	}
	return writeJSON(w, out, true)
}

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
				return refusef(c, "%v", err)
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
		fmt.Fprintf(w, "(%s shown, there may be more: --limit raises the cap, up to %d)\n", plural.Count(len(rows), "row", "rows"), outboxdb.MaxFindLimit)
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

// operatorFlag names who runs a command that changes rows, for
// forward_operator_log.
func operatorFlag() cli.Flag {
	return &cli.StringFlag{Name: "operator", Usage: "who is running this, for the audit log (default: $USER)"}
}

// operatorName is --operator, else $USER, else the OS account's name. An
// --operator given empty is refused rather than replaced (a script's unset
// variable must not sign the audit log with someone else's name).
func operatorName(c *cli.Context) (string, error) {
	if op := strings.TrimSpace(c.String("operator")); op != "" {
		return op, nil
	}
	if c.IsSet("operator") {
		return "", errors.New("--operator must not be empty")
	}
	if op := strings.TrimSpace(os.Getenv("USER")); op != "" {
		return op, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	return "", errors.New("cannot tell who you are for the audit log: set --operator NAME")
}
