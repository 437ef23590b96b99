package outboxdb

import (
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"0s", 0},
		{"36h", 36 * time.Hour},
		{"7d", 7 * 24 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"1.5d", 36 * time.Hour},
		{"90m", 90 * time.Minute},
		{"1h30m15s", time.Hour + 30*time.Minute + 15*time.Second},
		{"250ms", 250 * time.Millisecond},
		{"2d0h", 48 * time.Hour},
		{".5d", 12 * time.Hour},
	} {
		got, err := ParseDuration(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "7", "d", "-1d", "+1h", "7days", "1x", "1d 2h", "1..5d", "200000d", "106751d106751d"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		} else if in != "" && !strings.Contains(err.Error(), in) {
			t.Errorf("ParseDuration(%q) error %q does not name the input", in, err)
		}
	}
}

func TestParseDurationErrors(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"1w":             `duration "1w": unknown unit "w" (want ns, us, ms, s, m, h or d)`,
		"1..5d":          `duration "1..5d": missing unit`,
		"1.x5d":          `duration "1.x5d": unknown unit "x"`,
		"200000d":        `duration "200000d": too long (the limit is about 106751d)`,
		"106752d":        `duration "106752d": too long (the limit is about 106751d)`,
		"106751d106751d": `duration "106751d106751d": too long (the limit is about 106751d)`,
		"7":              `duration "7": want a number and a unit`,
	} {
		_, err := ParseDuration(in)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParseDuration(%q) error %v, want %q", in, err, want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		1500 * time.Millisecond:               "2s",
		45 * time.Second:                      "45s",
		26*time.Hour + 3*time.Minute:          "1d2h3m",
		time.Hour:                             "1h",
		time.Hour + 5*time.Second:             "1h0m5s",
		90 * time.Minute:                      "1h30m",
		10 * time.Minute:                      "10m",
		25 * time.Hour:                        "1d1h",
		100 * time.Millisecond:                "100ms",
		7 * 24 * time.Hour:                    "7d",
		7*24*time.Hour + 400*time.Millisecond: "7d",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// FuzzParseDuration checks that ParseDuration never panics, never returns a
// negative duration, agrees with time.ParseDuration on the inputs both accept
// without a day unit, and reads back what FormatDuration writes.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"0", "0s", "7d", "36h", "1d12h", "1.5d", "1h30m", "-1h", "99999999999d", ".d", "1µs", "3e2s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		if !strings.Contains(s, "d") {
			if g, gerr := time.ParseDuration(s); gerr != nil || g != d {
				t.Fatalf("ParseDuration(%q) = %v but time.ParseDuration = %v, %v", s, d, g, gerr)
			}
		}
		if d >= time.Second {
			d = d.Round(time.Second)
		}
		back, err := ParseDuration(FormatDuration(d))
		if err != nil || back != d {
			t.Fatalf("round trip of %v through %q = %v, %v", d, FormatDuration(d), back, err)
		}
	})
}
