package outboxcli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func TestRequeue(t *testing.T) {
	t.Parallel()

	// mixed is one row of each kind the filters tell apart.
	mixed := []row{
		{key: "pending", attempts: 1},
		{key: "success", status: "SUCCESS", attempts: 1, logs: [][2]string{{"SUCCESS", ""}}},
		{key: "live", status: "IN_PROGRESS", attempts: 2, leaseLeft: time.Minute},
		{key: "expired", status: "IN_PROGRESS", attempts: 3, leaseLeft: -time.Minute},
		{key: "f998", status: "FAILED", attempts: 1, logs: [][2]string{{"FAILED", "998"}}},
		{key: "f998-then-999", status: "FAILED", attempts: 5,
			logs: [][2]string{{"PENDING", "998"}, {"FAILED", "999"}}},
		{key: "f999-lease", status: "FAILED", attempts: 5,
			logs: [][2]string{{"FAILED", "999"}, {"LEASE_EXPIRED", ""}}},
		{key: "fmap", status: "FAILED"},
		{key: "f-old", status: "FAILED", attempts: 5, age: 48 * time.Hour, logs: [][2]string{{"FAILED", "999"}}},
	}

	t.Run("FailedByDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, mixed...)
		out := b.mustRun(t, "requeue")
		if strings.TrimSpace(out) != "5 rows requeued" {
			t.Fatalf("output %q, want 5 rows requeued", out)
		}
		for _, r := range mixed {
			s, _ := b.state(t, r.key)
			if r.status == "FAILED" {
				if s.Status != "PENDING" || s.AttemptCount != 0 || !s.Due || s.Claimed || s.Requeues != 1 || s.Logs != len(r.logs)+1 {
					t.Errorf("%s after requeue: %+v, want PENDING, 0 attempts, due, unclaimed, one REQUEUED log more", r.key, s)
				}
				continue
			}
			if s.Requeues != 0 || s.Status != string(orPending(r.status)) {
				t.Errorf("%s (%s) was touched: %+v", r.key, orPending(r.status), s)
			}
		}
		var attempt int
		var msg string
		if err := b.pool.QueryRow(context.Background(), `SELECT attempt_number, error_message FROM forward_retry_logs l
			JOIN forward_records r ON r.id = l.record_id
			WHERE r.message_key = 'f-old' AND l.result_status = 'REQUEUED'`).Scan(&attempt, &msg); err != nil {
			t.Fatal(err)
		}
		if attempt != 5 || !strings.Contains(msg, "was FAILED after 5 attempts") {
			t.Errorf("audit row: attempt_number %d, message %q; want 5 and the previous state", attempt, msg)
		}
	})

	t.Run("DryRunOnlyCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, mixed...)
		out := b.mustRun(t, "requeue", "--dry-run", "--errcode", "999")
		if !strings.HasPrefix(out, "3 rows would be requeued") {
			t.Fatalf("output %q, want 3 rows would be requeued", out)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_records WHERE status = 'FAILED'"); n != 5 {
			t.Errorf("%d FAILED rows after a dry run, want 5", n)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_retry_logs WHERE result_status = 'REQUEUED'"); n != 0 {
			t.Errorf("%d audit rows after a dry run, want 0", n)
		}
	})

	// Filters: each case lists the keys it must requeue; the dry run must
	// count exactly as many, so the two SQL files cannot drift apart.
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"Errcode", []string{"--errcode", "999"}, []string{"f998-then-999", "f999-lease", "f-old"}},
		{"ErrcodeLatestAttemptOnly", []string{"--errcode", "998"}, []string{"f998"}},
		{"Since", []string{"--since", "1d"}, []string{"f998", "f998-then-999", "f999-lease", "fmap"}},
		{"Keys", []string{"--key", "fmap", "--key", "f998", "--key", "pending"}, []string{"fmap", "f998"}},
		{"ErrcodeAndSince", []string{"--errcode", "999", "--since", "36h"}, []string{"f998-then-999", "f999-lease"}},
		{"InProgressOnlyWhenLeaseExpired", []string{"--status", "IN_PROGRESS"}, []string{"expired"}},
		{"StatusList", []string{"--status", "pending,success", "--key", "pending", "--key", "success", "--key", "fmap"},
			[]string{"pending", "success"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.insert(t, mixed...)
			dry := b.mustRun(t, append([]string{"requeue", "--dry-run"}, c.args...)...)
			if want := fmt.Sprintf("%d rows would be requeued", len(c.want)); !strings.HasPrefix(dry, want) {
				t.Errorf("dry run said %q, want %q", dry, want)
			}
			out := b.mustRun(t, append([]string{"requeue"}, c.args...)...)
			if want := fmt.Sprintf("%d rows requeued\n", len(c.want)); out != want {
				t.Errorf("requeue said %q, want %q", out, want)
			}
			wanted := map[string]bool{}
			for _, k := range c.want {
				wanted[k] = true
			}
			for _, r := range mixed {
				s, _ := b.state(t, r.key)
				if got := s.Requeues == 1; got != wanted[r.key] {
					t.Errorf("%s requeued = %v, want %v (%+v)", r.key, got, wanted[r.key], s)
				}
				if wanted[r.key] && (s.Status != "PENDING" || s.AttemptCount != 0 || s.Claimed || !s.Due) {
					t.Errorf("%s after requeue: %+v", r.key, s)
				}
			}
		})
	}

	t.Run("BatchesVisitEachRowOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var rows []row
		for i := range 7 {
			rows = append(rows, row{key: fmt.Sprintf("p%d", i), attempts: 3})
		}
		b.insert(t, rows...)
		// Requeued PENDING rows still match --status PENDING: the batches
		// must walk on rather than requeue the same rows again.
		out := b.mustRun(t, "requeue", "--status", "PENDING", "--batch-size", "2")
		if out != "7 rows requeued\n" {
			t.Fatalf("output %q, want 7 rows requeued", out)
		}
		if n := b.count(t, "SELECT count(*) FROM forward_retry_logs WHERE result_status = 'REQUEUED'"); n != 7 {
			t.Errorf("%d audit rows, want 7", n)
		}
	})

	t.Run("NotifiesDispatchers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, row{key: "f", status: "FAILED"})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "LISTEN "+outboxdb.NotifyChannel); err != nil {
			t.Fatal(err)
		}
		b.mustRun(t, "requeue")
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no notification after requeue: %v", err)
		}
		if n.Channel != outboxdb.NotifyChannel {
			t.Errorf("notified %q, want %q", n.Channel, outboxdb.NotifyChannel)
		}
	})

	t.Run("RejectsBadFlags", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, args := range [][]string{
			{"--status", "DONE"},
			{"--since", "yesterday"},
			{"--since", "0s"},
			{"--batch-size", "0"},
		} {
			out, err := b.run(t, append([]string{"requeue"}, args...)...)
			if err == nil {
				t.Errorf("requeue %v succeeded (%q), want an error", args, out)
			} else if !strings.Contains(err.Error(), args[0]) {
				t.Errorf("requeue %v: error %q does not name %s", args, err, args[0])
			}
		}
	})
}

func orPending(s outboxdb.Status) outboxdb.Status {
	if s == "" {
		return outboxdb.StatusPending
	}
	return s
}
