package outboxcli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// What the lookup commands, show (show.go) and find (find.go), share. Both
// only read, in a read-only transaction bounded by --timeout
// (outboxdb.ReadOnly).

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
		return 0, cli.Exit(fmt.Sprintf("%s: --timeout %s: want at least 1ms", commandPath(c), d), 2)
	}
	return d, nil
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
