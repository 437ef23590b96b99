package outboxcli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestPauseResume: `outbox pause` and `outbox resume` change the pause every
// instance reads (outboxdb.ReadPlatformState), `outbox stats` shows who
// paused, why and until when, and each leaves an audit row.
func TestPauseResume(t *testing.T) {
	t.Parallel()

	platform := func(t *testing.T, b *testBundle) outboxdb.PlatformState {
		t.Helper()
		s, err := outboxdb.ReadPlatformState(context.Background(), b.pool)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("UntilResumed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if out := b.mustRun(t, "stats"); !strings.Contains(out, "delivery: not paused\n") {
			t.Errorf("stats before any pause:\n%s", out)
		}
		out := b.mustRun(t, "pause", "--operator", "alice", "--reason", "platform upgrade 'v2'; ticket #42")
		if !strings.Contains(out, "delivery paused by alice since ") || !strings.Contains(out, "until resumed") {
			t.Errorf("pause said:\n%s", out)
		}
		s := platform(t, b)
		if !s.Pause.InForce || !s.Pause.Until.IsZero() || s.Pause.By != "alice" || s.Pause.Reason != "platform upgrade 'v2'; ticket #42" || s.Pause.Left != 0 {
			t.Errorf("shared state after pause: %+v", s.Pause)
		}
		stats := b.mustRun(t, "stats")
		if !strings.Contains(stats, "delivery: PAUSED by alice for ") || !strings.Contains(stats, "until resumed (outbox resume): platform upgrade 'v2'; ticket #42") {
			t.Errorf("stats while paused:\n%s", stats)
		}
		var js struct {
			Platform struct {
				Pause *struct {
					By     string     `json:"by"`
					Reason string     `json:"reason"`
					Until  *time.Time `json:"until"`
				} `json:"delivery_pause"`
			} `json:"platform"`
		}
		if err := json.Unmarshal([]byte(b.mustRun(t, "stats", "--json")), &js); err != nil {
			t.Fatal(err)
		}
		if p := js.Platform.Pause; p == nil || p.By != "alice" || p.Until != nil || p.Reason == "" {
			t.Errorf("stats --json delivery_pause = %+v", p)
		}

		out = b.mustRun(t, "resume", "--operator", "bob")
		if !strings.Contains(out, "delivery resumed by bob") {
			t.Errorf("resume said:\n%s", out)
		}
		if s := platform(t, b); s.Pause.InForce || s.Pause.Until.IsZero() {
			t.Errorf("shared state after resume: %+v", s.Pause)
		}
		if stats := b.mustRun(t, "stats"); !strings.Contains(stats, "delivery: not paused (the last pause, by alice, ended ") {
			t.Errorf("stats after resume:\n%s", stats)
		}
		if out, err := b.run(t, "resume", "--operator", "bob"); err == nil || !strings.Contains(out+err.Error(), "delivery is not paused") {
			t.Errorf("a resume with nothing paused: %v\n%s", err, out)
		}

		log := b.operatorLog(t)
		if len(log) != 2 || log[0].Action != "pause" || log[0].Operator != "alice" ||
			log[0].Filter != "until resumed: platform upgrade 'v2'; ticket #42" || log[1].Action != "resume" || log[1].Operator != "bob" {
			t.Errorf("operator log: %+v", log)
		}
	})

	t.Run("EndsByItself", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Long enough for the stats below to run while it lasts with eight
		// tests at once on a loaded machine (1.5 s was not).
		b.mustRun(t, "pause", "--operator", "alice", "--until", "5s")
		s := platform(t, b)
		if !s.Pause.InForce || s.Pause.Left <= 0 || s.Pause.Left > 5*time.Second {
			t.Fatalf("a pause of 5 s: %+v", s.Pause)
		}
		stats := b.mustRun(t, "stats")
		if !strings.Contains(stats, "delivery: PAUSED by alice") || !strings.Contains(stats, ", until ") {
			t.Errorf("stats while paused:\n%s", stats)
		}
		time.Sleep(time.Until(s.Pause.Until) + 200*time.Millisecond)
		if s := platform(t, b); s.Pause.InForce {
			t.Errorf("the pause outlived its end: %+v", s.Pause)
		}
		if out, err := b.run(t, "resume"); err == nil {
			t.Errorf("resume after the pause ended by itself succeeded:\n%s", out)
		}
	})

	t.Run("PauseAgainKeepsTheStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mustRun(t, "pause", "--operator", "alice", "--until", "1h", "--reason", "first")
		first := platform(t, b).Pause
		until := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
		b.mustRun(t, "pause", "--operator", "carol", "--until", until.Format(time.RFC3339), "--reason", "longer")
		again := platform(t, b).Pause
		if !again.Since.Equal(first.Since) || !again.Until.Equal(until) || again.By != "carol" || again.Reason != "longer" {
			t.Errorf("paused again: %+v, first %+v, want the first's start and the new end %v", again, first, until)
		}
	})

	// Days, as in every other duration an operator types (requeue
	// --since, purge --older-than).
	t.Run("UntilInDays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		before := time.Now()
		b.mustRun(t, "pause", "--operator", "alice", "--until", "2d")
		if until := platform(t, b).Pause.Until; until.Before(before.Add(48*time.Hour)) || until.After(time.Now().Add(48*time.Hour)) {
			t.Errorf("pause --until 2d ends at %v, want 48h after %v", until, before)
		}
	})

	t.Run("BadUntil", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for until, want := range map[string]string{
			"tomorrow":             "neither an RFC 3339 time",
			"-5m":                  "must be positive",
			"0":                    "must be at least 1s",
			"1ms":                  "must be at least 1s", // passed before the database recorded it
			"106752d":              "too long",
			"2001-01-01T00:00:00Z": "has passed",
		} {
			out, err := b.run(t, "pause", "--until", until)
			if err == nil || !strings.Contains(out+err.Error(), want) {
				t.Errorf("pause --until %s: %v\n%s, want %q", until, err, out, want)
			}
		}
		if out, err := b.run(t, "pause", "--operator", " "); err == nil {
			t.Errorf("pause with an empty operator succeeded:\n%s", out)
		}
		if s := platform(t, b); !s.Pause.Since.IsZero() {
			t.Errorf("a refused pause changed the state: %+v", s.Pause)
		}
	})
}

// TestCommandsOnAReadOnlyDatabase: a command that writes, run against a
// database that takes no writes (a standby, default_transaction_read_only),
// says so and what to change, besides PostgreSQL's own error; one that only
// reads works there.
func TestCommandsOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pgtest.SetReadOnly(t, b.pool, true)
	for _, args := range [][]string{{"pause", "--operator", "alice"}, {"requeue", "--status", "PENDING", "--operator", "alice"}} {
		out, err := b.run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "the database accepts no writes") ||
			!strings.Contains(err.Error(), "target_session_attrs=read-write") || !strings.Contains(err.Error(), "SQLSTATE 25006") {
			t.Errorf("outbox %s on a read-only database: %v, want it to say the database takes no writes:\n%s", args[0], err, out)
		}
	}
	if out, err := b.run(t, "stats"); err != nil {
		t.Errorf("outbox stats on a read-only database: %v\n%s", err, out)
	}
}
