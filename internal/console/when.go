package console

import (
	"fmt"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// ParseWhen reads the --since and --until of a search: a duration back from
// now ("2h", "7d"), or a date or time (UTC unless it has a zone; the
// console's datetime-local fields send "2006-01-02T15:04"). "" is the zero
// time.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	d, durErr := outboxdb.ParseDuration(s)
	if durErr == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if outboxdb.MeantAsDuration(s) {
		return time.Time{}, durErr
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration (2h, 7d) nor a time (2026-05-21, \"2026-05-21 10:30\", RFC 3339)", s)
}
