package outboxcli_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func TestStats(t *testing.T) {
	t.Parallel()

	t.Run("EmptyOutbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		out := b.mustRun(t, "stats")
		for _, want := range []string{"rows by status:\n  PENDING               0\n", "FAILED                0\n", "total                 0\n", "oldest undelivered row: none",
			"top failure reasons (FAILED rows, last_error): none", "top platform errcodes (FAILED rows, latest attempt): none"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})

	// Every duration stats prints is to the second, a young row's age too
	// (not "876.236ms old" beside "42s").
	t.Run("AgesToTheSecond", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, row{key: "young", age: 300 * time.Millisecond})
		out := b.mustRun(t, "stats")
		if !regexp.MustCompile(`oldest undelivered row: (\d+[dhm])*\d+s old \(id \d+, key young,`).MatchString(out) {
			t.Errorf("the oldest row's age is not to the second:\n%s", out)
		}
	})

	t.Run("CountsOldestAndTops", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t,
			row{key: "p-new"},
			row{key: "p-old", age: 2 * time.Hour, attempts: 2},
			row{key: "ip", status: "IN_PROGRESS", age: time.Hour, leaseLeft: time.Minute},
			row{key: "s1", status: "SUCCESS", age: 3 * time.Hour},
			row{key: "s2", status: "SUCCESS"},
			row{key: "s3", status: "SUCCESS"},
			row{key: "f998a", status: "FAILED", attempts: 1, lastErr: "platform rejected: errcode 998",
				logs: [][2]string{{"FAILED", "998"}}},
			row{key: "f998b", status: "FAILED", attempts: 2, lastErr: "platform rejected: errcode 998",
				logs: [][2]string{{"PENDING", "999"}, {"FAILED", "998"}}},
			// The lease-expiry log after the real attempt carries no errcode
			// and must not hide the attempt's.
			row{key: "f999", status: "FAILED", attempts: 5, lastErr: "platform busy: errcode 999",
				logs: [][2]string{{"FAILED", "999"}, {"LEASE_EXPIRED", ""}}},
			row{key: "fmap", status: "FAILED", lastErr: "mapping: inoutType 7 is not 0 or 1"},
		)
		out := b.mustRun(t, "stats")
		for _, re := range []string{
			`PENDING\s+2\n`, `IN_PROGRESS\s+1\n`, `SUCCESS\s+3\n`, `FAILED\s+4\n`, `total\s+10\n`,
			`oldest undelivered row: 2h(0m\d+s)? old \(id \d+, key p-old, PENDING,`,
			`(?s)failure reasons.*\n\s+2\s+platform rejected: errcode 998\n\s+1\s+mapping: inoutType 7 is not 0 or 1\n\s+1\s+platform busy: errcode 999\n`,
			`(?s)errcodes.*\n\s+2\s+998\n\s+1\s+\(none\)\n\s+1\s+999\n`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("output does not match %s:\n%s", re, out)
			}
		}

		var js struct {
			Rows   map[string]int64 `json:"rows"`
			Total  int64            `json:"total"`
			Oldest struct {
				MessageKey string  `json:"message_key"`
				AgeSeconds float64 `json:"age_seconds"`
			} `json:"oldest_undelivered"`
			FailureErrcodes []struct {
				Value string `json:"value"`
				Rows  int64  `json:"rows"`
			} `json:"failure_errcodes"`
		}
		if err := json.Unmarshal([]byte(b.mustRun(t, "stats", "--json", "--top", "1")), &js); err != nil {
			t.Fatal(err)
		}
		if js.Rows["FAILED"] != 4 || js.Total != 10 || js.Oldest.MessageKey != "p-old" || js.Oldest.AgeSeconds < 7200 {
			t.Errorf("json stats = %+v", js)
		}
		if len(js.FailureErrcodes) != 1 || js.FailureErrcodes[0].Value != "998" || js.FailureErrcodes[0].Rows != 2 {
			t.Errorf("--top 1 errcodes = %+v, want only 998 x2", js.FailureErrcodes)
		}
	})

	t.Run("PlatformAndTransientFailures", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		out := b.mustRun(t, "stats")
		if !regexp.MustCompile(`platform: breaker CLOSED for \S+\n`).MatchString(out) ||
			!strings.Contains(out, "failed on transient errors: 0 waiting for automatic requeue, 0 frozen") {
			t.Errorf("a quiet platform and no failures:\n%s", out)
		}

		if _, err := outboxdb.SetBreaker(ctx, b.pool, []string{"CLOSED"}, "OPEN", "test", "HTTP 503 from the platform", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := outboxdb.PausePlatform(ctx, b.pool, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		b.insert(t,
			row{key: "t0", status: "FAILED", lastErr: "platform busy: errcode 999"},
			row{key: "t2", status: "FAILED", lastErr: "platform busy: errcode 999"},
			row{key: "t3", status: "FAILED", lastErr: "platform busy: errcode 999"},
			row{key: "r", status: "FAILED", lastErr: "platform rejected: errcode 998"},
		)
		if _, err := b.pool.Exec(ctx, `UPDATE forward_deliveries SET failure_class = 'TRANSIENT',
			requeue_rounds = substr(message_key, 2)::int WHERE message_key LIKE 't%'`); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(ctx, `UPDATE forward_deliveries SET failure_class = 'REJECTED' WHERE message_key = 'r'`); err != nil {
			t.Fatal(err)
		}

		out = b.mustRun(t, "stats", "--requeue-rounds", "3")
		for _, re := range []string{
			`platform: breaker OPEN for \S+ \(HTTP 503 from the platform\), next probe in \S+; sending paused for (1m\d+s|2m) \(Retry-After\)\n`,
			`failed on transient errors: 2 waiting for automatic requeue, 1 frozen \(requeue rounds used up\)\n`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("output does not match %s:\n%s", re, out)
			}
		}
		// Compensation off (FAILED_REQUEUE_ROUNDS=0): every such row is frozen.
		var js struct {
			Platform struct {
				Breaker     string     `json:"breaker"`
				Reason      string     `json:"reason"`
				NextProbeAt *time.Time `json:"next_probe_at"`
				PausedUntil *time.Time `json:"paused_until"`
			} `json:"platform"`
			Failed struct {
				Waiting int64 `json:"waiting_requeue"`
				Frozen  int64 `json:"frozen"`
			} `json:"failed_transient"`
		}
		if err := json.Unmarshal([]byte(b.mustRun(t, "stats", "--json", "--requeue-rounds", "0")), &js); err != nil {
			t.Fatal(err)
		}
		if js.Platform.Breaker != "OPEN" || js.Platform.Reason != "HTTP 503 from the platform" ||
			js.Platform.NextProbeAt == nil || js.Platform.PausedUntil == nil || js.Failed.Waiting != 0 || js.Failed.Frozen != 3 {
			t.Errorf("json stats = %+v", js)
		}
		// The most rounds a row can be given: every such row is waiting.
		// One more is refused with the range, not sent to PostgreSQL.
		out = b.mustRun(t, "stats", "--requeue-rounds", "2147483647")
		if !strings.Contains(out, "failed on transient errors: 3 waiting for automatic requeue, 0 frozen") {
			t.Errorf("stats with the most rounds:\n%s", out)
		}
		if _, err := b.run(t, "stats", "--requeue-rounds", "2147483648"); exitCode(err) != 2 ||
			err.Error() != "outbox stats: --requeue-rounds 2147483648 (FAILED_REQUEUE_ROUNDS): want 0 to 2147483647" {
			t.Errorf("stats with rounds beyond an integer column: %v", err)
		}
	})
}
