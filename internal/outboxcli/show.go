package outboxcli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

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
				return cli.Exit("outbox show: give one message_key or id", 2)
			case c.NArg() > 1:
				// urfave/cli reads no flag after the argument: `show k --json`
				// would otherwise be refused as two keys, or not understood.
				return cli.Exit(fmt.Sprintf("outbox show: one message_key or id, got %s: flags go before the key", quoteArgs(c.Args().Slice())), 2)
			}
			ref := c.Args().First()
			timeout, err := lookupTimeout(c)
			if err != nil {
				return err
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				v, err := outboxdb.ShowRecord(ctx, pool, ref, outboxdb.LookupOptions{Timeout: timeout})
				if errors.Is(err, outboxdb.ErrNoRecord) {
					return cli.Exit(fmt.Sprintf("outbox show: no row with message_key or id %s", strconv.Quote(ref)), 1)
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
	line := fmt.Sprintf("row %d (message_key %s): %s, %s", h.ID, console.SafeLine(h.MessageKey), h.Status, plural(h.AttemptCount, "attempt", "attempts"))
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
