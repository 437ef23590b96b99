package outboxcli_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

func TestPurge(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour

	// Days 10 to 13 ago, each in its own partition: day 10 holds delivered
	// rows only, 11 also a FAILED row, 12 also a PENDING row, 13 also an
	// IN_PROGRESS row; one delivered row of yesterday.
	setupDays := func(t *testing.T, b *testBundle) *fixture.DB {
		t.Helper()
		db := fixture.New(t, b.pool)
		for d := 10; d <= 13; d++ {
			var rows []fixture.Row
			for i := range 2 {
				rows = append(rows, fixture.Row{Key: fmt.Sprintf("day%d-done-%d", d, i), Status: "SUCCESS", Attempts: 1})
			}
			switch d {
			case 11:
				rows = append(rows, fixture.Row{Key: "day11-failed", Status: "FAILED", FailureClass: "REJECTED", LastError: "errcode 998"})
			case 12:
				rows = append(rows, fixture.Row{Key: "day12-pending", Status: "PENDING", Attempts: 4})
			case 13:
				rows = append(rows, fixture.Row{Key: "day13-in-progress", Status: "IN_PROGRESS", Attempts: 1})
			}
			for i := range rows {
				rows[i].Age = time.Duration(d)*day + time.Duration(i)*time.Minute
			}
			db.Insert(rows...)
		}
		db.Insert(fixture.Row{Key: "recent-done", Status: "SUCCESS", Attempts: 1, Age: day})
		return db
	}
	left := func(t *testing.T, db *fixture.DB, prefix string) int {
		t.Helper()
		return db.Count("message_key LIKE $1", prefix+"%")
	}

	t.Run("RetiresFinishedDaysKeepsUnfinishedOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := setupDays(t, b)
		out := b.mustRun(t, "purge", "--older-than", "7d", "--operator", "alice")
		first, _, _ := strings.Cut(out, "\n")
		if !strings.HasPrefix(first, "retiring the partitions that ended before ") ||
			!strings.HasSuffix(first, " (older than 7d) and whose messages are all finished (operator alice)") {
			t.Errorf("output %q, want first what will be retired and who asked", out)
		}
		for _, want := range []string{" retired: 2 messages\n", " retired: 3 messages, 1 of them FAILED\n", " kept: 1 PENDING row\n",
			" kept: 1 IN_PROGRESS row\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("output %q, want a line with %q", out, want)
			}
		}
		if last := lastLine(out); !strings.HasPrefix(last, "retired ") || !strings.HasSuffix(last, " partitions of 5 messages (1 FAILED); kept 2 partitions") {
			t.Errorf("last line %q, want 5 messages (1 FAILED) retired and 2 partitions kept", last)
		}
		for prefix, want := range map[string]int{"day10-": 0, "day11-": 0, "day12-": 3, "day13-": 3, "recent-": 1} {
			if n := left(t, db, prefix); n != want {
				t.Errorf("%s rows left: %d, want %d", prefix, n, want)
			}
		}
		log := b.operatorLog(t)
		if len(log) != 2 {
			t.Fatalf("operator log %+v, want the two retired days", log)
		}
		for _, a := range log {
			if a.Operator != "alice" || a.Action != outboxdb.ActionPurge || !strings.Contains(a.Filter, " retired (older than 7d)") {
				t.Errorf("operator log row %+v, want alice's purge of a day", a)
			}
		}
		out = b.mustRun(t, "purge", "--older-than", "7d")
		if last := lastLine(out); last != "retired 0 partitions of 0 messages (0 FAILED); kept 2 partitions" {
			t.Errorf("second purge: %q, want nothing left to retire", out)
		}
		if log := b.operatorLog(t); len(log) != 3 || !strings.Contains(log[2].Filter, "none retired, 2 partitions kept") {
			t.Errorf("operator log %+v, want the run that retired nothing recorded too", log)
		}
	})

	t.Run("DryRunOnlyPlans", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := setupDays(t, b)
		out := b.mustRun(t, "purge", "--older-than", "10d", "--dry-run")
		// Days 11 to 13 ended more than 10 days ago; day 10 did not.
		for _, want := range []string{" would be retired: 3 messages, 1 of them FAILED\n", " kept: 1 PENDING row\n",
			" kept: 1 IN_PROGRESS row\n", "(dry run, nothing changed)"} {
			if !strings.Contains(out, want) {
				t.Errorf("output %q, want a line with %q", out, want)
			}
		}
		if strings.Contains(out, "2 messages") {
			t.Errorf("output %q: day 10 is not older than 10d", out)
		}
		if log := b.operatorLog(t); len(log) != 0 {
			t.Errorf("a dry run was recorded: %+v", log)
		}
		if n := left(t, db, "day"); n != 11 {
			t.Errorf("%d rows after a dry run, want 11", n)
		}
	})

	t.Run("BelowTheSafeMinimumNeedsForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := setupDays(t, b)
		for _, age := range []string{"0s", "1h", "23h59m"} {
			out, err := b.run(t, "purge", "--older-than", age)
			if err == nil || !strings.Contains(err.Error(), "--older-than "+age+" is below the safe minimum of 1d") ||
				!strings.Contains(err.Error(), "redelivery") || !strings.Contains(err.Error(), "--force") {
				t.Errorf("purge --older-than %s: %v (%q), want a refusal that explains why and names --force", age, err, out)
			}
		}
		if n := left(t, db, ""); n != 12 {
			t.Errorf("%d rows after refused purges, want 12", n)
		}
		if log := b.operatorLog(t); len(log) != 0 {
			t.Errorf("refused purges were recorded: %+v", log)
		}
		// 24h, the minimum, needs no --force.
		if out := b.mustRun(t, "purge", "--older-than", "24h", "--dry-run"); !strings.Contains(out, "(dry run, nothing changed)") {
			t.Errorf("24h (the minimum) without --force: %q", out)
		}
	})

	t.Run("ZeroWithForceRetiresEveryFinishedPastPartition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := setupDays(t, b)
		b.mustRun(t, "purge", "--older-than", "0s", "--force", "--operator", "bob")
		// Yesterday's partition ended before now: it goes too. Today's
		// partition (and those ahead) have not ended.
		for prefix, want := range map[string]int{"day10-": 0, "day11-": 0, "day12-": 3, "day13-": 3, "recent-": 0} {
			if n := left(t, db, prefix); n != want {
				t.Errorf("%s rows left: %d, want %d", prefix, n, want)
			}
		}
		if log := b.operatorLog(t); len(log) != 3 || log[0].Operator != "bob" || log[2].Operator != "bob" {
			t.Errorf("operator log %+v, want bob's three retired days", log)
		}
	})

	t.Run("SafeWhileRowsAreWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := setupDays(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		var (
			wg       sync.WaitGroup
			written  int
			writeErr error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The service's writes meanwhile: new rows stored now.
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := outboxdb.InsertBatchCount(ctx, b.pool, []outboxdb.NewRecord{{MessageKey: fmt.Sprintf("live-%d", i),
					APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending}}); err != nil {
					if ctx.Err() == nil {
						writeErr = err
					}
					return
				}
				written++
			}
		}()
		time.Sleep(50 * time.Millisecond)
		out, err := b.run(t, "purge", "--older-than", "7d", "--batch-size", "1")
		cancel()
		wg.Wait()
		if err != nil || writeErr != nil {
			t.Fatalf("purge: %v (%s); writer: %v", err, out, writeErr)
		}
		if last := lastLine(out); !strings.HasSuffix(last, " partitions of 5 messages (1 FAILED); kept 2 partitions") {
			t.Errorf("output %q, want the two finished days retired", out)
		}
		// The last insert may have committed as its context was cancelled,
		// so there can be one row more than the writer counted.
		if n := left(t, db, "live-"); n < written {
			t.Errorf("%d of %d live rows left, want all", n, written)
		}
	})

	t.Run("RejectsBadFlags", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{
			{"--older-than", "a week"},
			{"--older-than", "-7d"},
			{},
		} {
			if out, err := b.run(t, append([]string{"purge"}, args...)...); err == nil {
				t.Errorf("purge %v succeeded (%q), want an error", args, out)
			}
		}
	})
}
