package outboxdb_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestPausePlatformIsNeverShorterThanAsked: a Retry-After pause shared in
// the database ends no sooner than its length after the caller asked for
// it, whatever fraction of a millisecond the length carries (the statement
// truncated it to whole milliseconds: the pause shared after a 429 ended up
// to a millisecond early).
func TestPausePlatformIsNeverShorterThanAsked(t *testing.T) {
	t.Parallel()
	b := setupClaimTest(t)
	for _, d := range []time.Duration{
		time.Second + 999*time.Microsecond,
		5*time.Second + 999_600*time.Nanosecond,
		10*time.Second + 1,
	} {
		asked := time.Now()
		until, err := outboxdb.PausePlatform(b.Ctx, b.Pool, d)
		if err != nil {
			t.Fatal(err)
		}
		if until.Before(asked.Add(d)) {
			t.Errorf("a pause of %v asked for ends %v after it was asked: shorter", d, until.Sub(asked))
		}
	}
}

// TestPauseNotice: only a pause's announcement is read as one; any other
// payload on the channel (a new row's, an operator's requeue, a foreign
// or damaged one) is left for the wake-up.
func TestPauseNotice(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]time.Duration{
		"pause 0":        0,
		"pause 5000":     5 * time.Second,
		"pause 86400000": 24 * time.Hour,
	} {
		if got, ok := outboxdb.PauseNotice(payload); !ok || got != want {
			t.Errorf("PauseNotice(%q) = %v, %v; want %v", payload, got, ok, want)
		}
	}
	for _, payload := range []string{"", "requeued", "pause", "pause ", "pause -5", "pause 1.5", "pause 5s", "Pause 5", "pause 99999999999999999999", "pause 9223372036854775807"} {
		if got, ok := outboxdb.PauseNotice(payload); ok {
			t.Errorf("PauseNotice(%q) = %v, true; want not a pause", payload, got)
		}
	}
}

// TestHealthyNotice: a healthy reply's announcement reads back as sent,
// whatever the instance's name holds; nothing else on the channel is one.
func TestHealthyNotice(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	conn := pgtest.Listen(t, pool, outboxdb.NotifyChannel)
	for _, sent := range []struct {
		instance string
		ago      time.Duration
		want     time.Duration
	}{
		{"pod-7-1234", 0, 0},
		{"a host with spaces-9", 1500 * time.Microsecond, time.Millisecond},
		{"", -time.Second, 0},
		{"ünïcode 'quoted' \\ host", 24 * time.Hour, 24 * time.Hour},
	} {
		if err := outboxdb.AnnounceHealthy(ctx, pool, sent.instance, sent.ago); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		instance, ago, ok := outboxdb.HealthyNotice(n.Payload)
		if !ok || instance != sent.instance || ago != sent.want {
			t.Errorf("announced %q %v, read %q %v %v; want %q %v", sent.instance, sent.ago, instance, ago, ok, sent.instance, sent.want)
		}
		if _, ok := outboxdb.PauseNotice(n.Payload); ok {
			t.Errorf("%q read as a pause", n.Payload)
		}
	}
	for _, payload := range []string{"", "requeued", "healthy", "healthy ", "healthy 5", "healthy -5 x", "healthy 1.5 x", "Healthy 5 x", "healthy 9223372036854775807 x", "pause 5000", "idle x"} {
		if instance, ago, ok := outboxdb.HealthyNotice(payload); ok {
			t.Errorf("HealthyNotice(%q) = %q, %v, true; want not a healthy reply's", payload, instance, ago)
		}
	}
}

// TestRateWait: the wait for a rate limit's tokens, bounded whatever the
// rate, so that the smallest limit the config accepts neither overflows a
// Duration nor makes the caller ask again at once.
func TestRateWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tokens, rate float64
		want         time.Duration
	}{
		{5, 10, 500 * time.Millisecond},
		{1, 1.0 / 60, outboxdb.MaxRateWait},
		{1, 1.0 / 3600, outboxdb.MaxRateWait},
		{1, 1e-12, outboxdb.MaxRateWait},  // 1e21 ns overflowed to a negative wait
		{1, 1e-320, outboxdb.MaxRateWait}, // +Inf seconds
	} {
		if got := outboxdb.RateWait(c.tokens, c.rate); got != c.want {
			t.Errorf("%v tokens at %v a second: wait %v, want %v", c.tokens, c.rate, got, c.want)
		}
	}
}

func TestParsePauseEnd(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"90m":                  now.Add(90 * time.Minute),
		"2d":                   now.Add(48 * time.Hour),
		"1s":                   now.Add(time.Second),
		"2026-12-05T13:00:00Z": now.Add(time.Hour),
	} {
		got, err := outboxdb.ParsePauseEnd(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParsePauseEnd(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"0s":                   "the end of the pause 0s: a duration must be at least 1s",
		"1ms":                  "the end of the pause 1ms: a duration must be at least 1s",
		"-1h":                  "the end of the pause -1h: a duration must be positive",
		"106752d":              `the end of the pause: duration "106752d": too long (the limit is about 106751d)`,
		"2x":                   `the end of the pause: duration "2x": unknown unit "x"`,
		"tomorrow":             `the end of the pause "tomorrow" is neither an RFC 3339 time`,
		"2026-12-05 13:00":     `the end of the pause "2026-12-05 13:00" is neither an RFC 3339 time`,
		"2026-12-05T12:00:00Z": "the end of the pause 2026-12-05T12:00:00Z has passed",
	} {
		if _, err := outboxdb.ParsePauseEnd(in, now); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParsePauseEnd(%q) error %v, want %q", in, err, want)
		}
	}
}
