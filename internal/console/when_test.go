package console

import (
	"strings"
	"testing"
	"time"
)

func TestParseWhen(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                          {},
		"2h":                        now.Add(-2 * time.Hour),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"2026-05-21":                time.Date(2026, 5, 21, 0, 0, 0, 0, time.UTC),
		"2026-05-21 10:30":          time.Date(2026, 5, 21, 10, 30, 0, 0, time.UTC),
		"2026-05-21T10:30":          time.Date(2026, 5, 21, 10, 30, 0, 0, time.UTC),
		"2026-05-21T10:30:00+08:00": time.Date(2026, 5, 21, 2, 30, 0, 0, time.UTC),
	} {
		got, err := ParseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// A number with a unit gets the duration's own reason; anything else
	// is neither a duration nor a time.
	for in, want := range map[string]string{
		"106752d":    `duration "106752d": too long (the limit is about 106751d)`,
		"7x":         `duration "7x": unknown unit "x"`,
		"12":         `duration "12": want a number and a unit`,
		"2026-13-01": `"2026-13-01" is neither a duration (2h, 7d) nor a time`,
		"yesterday":  `"yesterday" is neither a duration (2h, 7d) nor a time`,
	} {
		if _, err := ParseWhen(in, now); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParseWhen(%q) error %v, want %q", in, err, want)
		}
	}
}
