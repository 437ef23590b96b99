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
		out := b.mustRun(t, "purge", "--older-than", "7d", "--batch-size", "4")
		if !strings.HasPrefix(out, "deleted 6 SUCCESS rows delivered before ") || !strings.Contains(out, " and 12 attempt logs, in 2 batches") {
			t.Fatalf("output %q, want 6 rows and 12 logs in 2 batches", out)
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
		if !strings.HasPrefix(out, "deleted 0 SUCCESS rows") {
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
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'"); n != 8 {
			t.Errorf("%d SUCCESS rows after a dry run, want 8", n)
		}
	})

	t.Run("ZeroDeletesEverySuccessRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fixture(t, b)
		b.mustRun(t, "purge", "--older-than", "0s")
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
				if _, err := b.pool.Exec(ctx, `INSERT INTO forward_records
					(message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, status, attempt_count, next_retry_at, succeeded_at)
					VALUES ($1, 'HEARTBEAT', 't', 0, $2, '\x7b7d', 'SUCCESS', 1, NULL, now())`, fmt.Sprintf("live-%d", i), i); err != nil {
					if ctx.Err() == nil {
						writeErr = err
					}
					return
				}
				written++
			}
		}()
		out, err := b.run(t, "purge", "--older-than", "1h", "--batch-size", "1")
		cancel()
		wg.Wait()
		if err != nil || writeErr != nil {
			t.Fatalf("purge: %v (%s); writer: %v", err, out, writeErr)
		}
		// The 6 old rows, recent-success and late-success (a day old each).
		if !strings.HasPrefix(out, "deleted 8 SUCCESS rows") {
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
