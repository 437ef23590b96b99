package outboxdb

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// errTooLong is a duration past time.Duration's range, about 292 years.
var errTooLong = errors.New("too long (the limit is about 106751d)")

// ParseDuration parses the durations of the outbox commands and of the
// pipeline settings that count in days (retention): Go's syntax
// (time.ParseDuration: "36h", "90m", "1h30m", "0s") plus a day unit "d" of 24
// hours, which may be combined and fractional like the others ("7d",
// "1d12h", "1.5d"). A bare "0" is zero. Durations are never negative, so no
// sign is accepted.
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	if s == "" {
		return 0, errors.New(`empty duration: want e.g. "7d", "36h" or "0s"`)
	}
	if s == "0" {
		return 0, nil
	}
	if s[0] == '-' || s[0] == '+' {
		return 0, fmt.Errorf("duration %q: no sign allowed, durations are never negative", orig)
	}
	var total time.Duration
	for s != "" {
		// One component: a decimal number, then a unit (letters up to the
		// next digit or dot).
		i := 0
		for i < len(s) && (s[i] == '.' || ('0' <= s[i] && s[i] <= '9')) {
			i++
		}
		j := i
		for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
			j++
		}
		num, unit := s[:i], s[i:j]
		s = s[j:]
		if num == "" || unit == "" {
			return 0, fmt.Errorf("duration %q: want a number and a unit (ns, us, ms, s, m, h, d) in each part, e.g. \"7d\" or \"1h30m\"", orig)
		}
		var d time.Duration
		var err error
		if unit == "d" {
			d, err = time.ParseDuration(num + "h")
			if err == nil {
				if d > math.MaxInt64/24 {
					err = errors.New("overflow")
				}
				d *= 24
			}
		} else {
			d, err = time.ParseDuration(num + unit)
		}
		if err != nil {
			if err = unwrapQuoted(err); err.Error() == "overflow" {
				err = errTooLong
			}
			return 0, fmt.Errorf("duration %q: %w", orig, err)
		}
		if total > math.MaxInt64-d {
			return 0, fmt.Errorf("duration %q: %w", orig, errTooLong)
		}
		total += d
	}
	return total, nil
}

// unwrapQuoted turns time.ParseDuration's error about one part into a
// reason, without its "time: " prefix and its quoting of the part.
func unwrapQuoted(err error) error {
	msg := strings.TrimPrefix(err.Error(), "time: ")
	if i := strings.Index(msg, " in duration "); i >= 0 {
		msg = msg[:i]
	} else if strings.HasPrefix(msg, "invalid duration") {
		msg = "invalid number"
	}
	if strings.HasPrefix(msg, "unknown unit") {
		msg += " (want ns, us, ms, s, m, h or d)"
	}
	return errors.New(msg)
}

// MeantAsDuration says whether s, which ParseDuration refused, was written
// as a duration: it starts with a digit and has no '-' or ':', which every
// date and time has. ParseDuration's error then says more than "neither a
// duration nor a time" (too long, an unknown unit).
func MeantAsDuration(s string) bool {
	return s != "" && s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:")
}

// FormatDuration writes d the way ParseDuration reads it, in whole days
// then Go's syntax for the rest without its zero minutes and seconds
// ("2d3h", "1h30m", "1h0m5s", "45s"), rounded to the second when it is at
// least a second.
func FormatDuration(d time.Duration) string {
	if d < 0 {
		return "-" + FormatDuration(-d)
	}
	if d >= time.Second {
		d = d.Round(time.Second)
	}
	const day = 24 * time.Hour
	days, rest := d/day, d%day
	s := ""
	if rest > 0 || days == 0 {
		s = rest.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	if days == 0 {
		return s
	}
	return fmt.Sprintf("%dd%s", days, s)
}
