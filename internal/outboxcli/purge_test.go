package outboxcli_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPurge(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour

	// Old rows of every status, interleaved by age with the old SUCCESS rows
	// so batches have to walk past them.
	fixture := func(t *testing.T, b *testBundle) {
		t.Helper()
		var rows []row
		for i := range 6 {
			age := time.Duration(10+i) * day
			rows = append(rows,
				row{key: fmt.Sprintf("old-success-%d", i), status: "SUCCESS", age: age,
					logs: [][2]string{{"PENDING", "999"}, {"SUCCESS", ""}}},
				row{key: fmt.Sprintf("old-failed-%d", i), status: "FAILED", age: age,
					logs: [][2]string{{"FAILED", "998"}}},
			)
		}
		rows = append(rows,
			row{key: "old-pending", age: 20 * day, attempts: 4, logs: [][2]string{{"PENDING", "999"}}},
			row{key: "old-in-progress", status: "IN_PROGRESS", age: 20 * day, leaseLeft: time.Minute},
			row{key: "recent-success", status: "SUCCESS", age: day},
			// Created long ago, delivered yesterday after an outage: kept.
			row{key: "late-success", status: "SUCCESS", age: 30 * day, deliveredAgo: ptr(day)},
		)
		b.insert(t, rows...)
	}

	t.Run("DeletesOnlyOldSuccessRowsAndTheirLogs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		out := b.mustRun(t, "purge", "--older-than", "7d", "--batch-size", "4", "--operator", "alice")
		first, _, _ := strings.Cut(out, "\n")
		if !strings.HasPrefix(first, "deleting 6 SUCCESS rows delivered before ") || !strings.HasSuffix(first, " (older than 7d) and their attempt logs (operator alice)") {
			t.Errorf("output %q, want first what will be deleted and who asked", out)
		}
		if last := lastLine(out); !strings.HasPrefix(last, "deleted 6 SUCCESS rows delivered before ") || !strings.Contains(last, " and 12 attempt logs, in 2 batches") {
			t.Fatalf("output %q, want 6 rows and 12 logs in 2 batches", out)
		}
		if log := b.operatorLog(t); len(log) != 1 || log[0].Operator != "alice" || log[0].Action != "purge" || log[0].Rows != 6 ||
			!strings.HasPrefix(log[0].Filter, "status=SUCCESS delivered before ") || !strings.HasSuffix(log[0].Filter, " (older than 7d)") {
			t.Errorf("operator log %+v, want one purge of 6 rows by alice", log)
		}
		for i := range 6 {
			if _, ok := b.state(t, fmt.Sprintf("old-success-%d", i)); ok {
				t.Errorf("old-success-%d survived", i)
			}
			if s, ok := b.state(t, fmt.Sprintf("old-failed-%d", i)); !ok || s.Logs != 1 {
				t.Errorf("old-failed-%d: present %v, state %+v; want kept with its log", i, ok, s)
			}
		}
		for _, k := range []string{"old-pending", "old-in-progress", "recent-success", "late-success"} {
			if _, ok := b.state(t, k); !ok {
				t.Errorf("%s was deleted", k)
			}
		}
		if n := b.count(t, "SELECT count(*) FROM forward_retry_logs l WHERE NOT EXISTS (SELECT 1 FROM forward_records r WHERE r.id = l.record_id)"); n != 0 {
			t.Errorf("%d orphan logs", n)
		}
		out = b.mustRun(t, "purge", "--older-than", "7d")
		if !strings.HasPrefix(lastLine(out), "deleted 0 SUCCESS rows") {
			t.Errorf("second purge: %q, want nothing left to delete", out)
		}
	})

	t.Run("DryRunOnlyCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		out := b.mustRun(t, "purge", "--older-than", "12d", "--dry-run")
		if !strings.HasPrefix(out, "4 SUCCESS rows delivered before ") || !strings.Contains(out, "dry run") {
			t.Fatalf("output %q, want 4 rows (10..15 days old, older than 12d: 12..15)", out)
		}
		if log := b.operatorLog(t); len(log) != 0 {
			t.Errorf("a dry run was recorded: %+v", log)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'"); n != 8 {
			t.Errorf("%d SUCCESS rows after a dry run, want 8", n)
		}
	})

	t.Run("BelowTheSafeMinimumNeedsForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		for _, age := range []string{"0s", "1h", "23h59m"} {
			out, err := b.run(t, "purge", "--older-than", age)
			if err == nil || !strings.Contains(err.Error(), "--older-than "+age+" is below the safe minimum of 1d") ||
				!strings.Contains(err.Error(), "redelivery") || !strings.Contains(err.Error(), "--force") {
				t.Errorf("purge --older-than %s: %v (%q), want a refusal that explains why and names --force", age, err, out)
			}
		}
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'"); n != 8 {
			t.Errorf("%d SUCCESS rows after refused purges, want 8", n)
		}
		if log := b.operatorLog(t); len(log) != 0 {
			t.Errorf("refused purges were recorded: %+v", log)
		}
		// Every SUCCESS row of the fixture was delivered a day ago or more.
		if out := b.mustRun(t, "purge", "--older-than", "24h", "--dry-run"); !strings.HasPrefix(out, "8 SUCCESS rows") {
			t.Errorf("24h (the minimum) without --force: %q", out)
		}
	})

	t.Run("ZeroDeletesEverySuccessRowWithForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		b.mustRun(t, "purge", "--older-than", "0s", "--force", "--operator", "bob")
		if log := b.operatorLog(t); len(log) != 1 || log[0].Rows != 8 || !strings.HasSuffix(log[0].Filter, "(older than 0s) --force") {
			t.Errorf("operator log %+v, want the forced purge of 8 rows", log)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'"); n != 0 {
			t.Errorf("%d SUCCESS rows left, want 0", n)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_records"); n != 8 {
			t.Errorf("%d rows left, want the 8 unfinished or failed", n)
		}
	})

	t.Run("SafeWhileRowsAreWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		written := 0
		var writeErr error
		go func() {
			defer wg.Done()
			// The service's writes meanwhile: new rows that succeed at once.
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := b.pool.Exec(ctx, `WITH m AS (
					INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
					VALUES ($1, 'HEARTBEAT', 't', 0, $2, '\x7b7d')
					RETURNING id, created_at)
					INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status)
					SELECT id, created_at, 1, 'SUCCESS', 200 FROM m`, fmt.Sprintf("live-%d", i), i); err != nil {
					if ctx.Err() == nil {
						writeErr = err
					}
					return
				}
				written++
			}
		}()
		out, err := b.run(t, "purge", "--older-than", "1h", "--batch-size", "1", "--force")
		cancel()
		wg.Wait()
		if err != nil || writeErr != nil {
			t.Fatalf("purge: %v (%s); writer: %v", err, out, writeErr)
		}
		// The 6 old rows, recent-success and late-success (a day old each).
		if !strings.HasPrefix(lastLine(out), "deleted 8 SUCCESS rows") {
			t.Errorf("output %q, want the 8 rows delivered over an hour ago deleted", out)
		}
		// The last insert may have committed as its context was cancelled,
		// so there can be one row more than the writer counted.
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE message_key LIKE 'live-%'"); n < int64(written) {
			t.Errorf("%d of %d live rows left, want all", n, written)
		}
	})

	t.Run("RejectsBadFlags", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{
			{"--older-than", "a week"},
			{"--older-than", "-7d"},
			{"--older-than", "7d", "--batch-size", "0"},
			{},
		} {
			if out, err := b.run(t, append([]string{"purge"}, args...)...); err == nil {
				t.Errorf("purge %v succeeded (%q), want an error", args, out)
			}
		}
	})
}
