package outboxcli_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestRequeue(t *testing.T) {
	t.Parallel()

	// mixed is one row of each kind the filters tell apart.
	mixed := []row{
		{key: "pending", attempts: 1},
		{key: "success", status: "SUCCESS", attempts: 1, logs: [][2]string{{"SUCCESS", ""}}},
		{key: "live", status: "IN_PROGRESS", attempts: 2, leaseLeft: time.Minute},
		{key: "expired", status: "IN_PROGRESS", attempts: 3, leaseLeft: -time.Minute},
		{key: "f998", status: "FAILED", attempts: 1, logs: [][2]string{{"FAILED", "998"}}, class: "REJECTED"},
		{key: "f998-then-999", status: "FAILED", attempts: 5, class: "TRANSIENT",
			logs: [][2]string{{"PENDING", "998"}, {"FAILED", "999"}}},
		{key: "f999-lease", status: "FAILED", attempts: 5, class: "TRANSIENT",
			logs: [][2]string{{"FAILED", "999"}, {"LEASE_EXPIRED", ""}}},
		{key: "fmap", status: "FAILED", class: "INVALID"},
		{key: "f-old", status: "FAILED", attempts: 5, age: 48 * time.Hour, logs: [][2]string{{"FAILED", "999"}}, class: "TRANSIENT"},
	}
	// transient are the FAILED rows a requeue takes without --include-*.
	transient := map[string]bool{"f998-then-999": true, "f999-lease": true, "f-old": true}

	t.Run("TransientFailedByDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, mixed...)
		out := b.mustRun(t, "requeue", "--operator", "alice")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		want := []string{
			"requeueing 3 rows: status=FAILED failure_class=TRANSIENT (operator alice)",
			"left out: 1 REJECTED by the platform (errcode 998 or a no_retry rule; --include-rejected takes them), " +
				"1 INVALID (bad input or a mapping error; --include-invalid takes them)",
			"3 rows requeued",
		}
		if !slices.Equal(lines, want) {
			t.Fatalf("output:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
		}
		for _, r := range mixed {
			s, _ := b.state(t, r.key)
			if transient[r.key] {
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
		var class *string
		if err := b.pool.QueryRow(context.Background(), `SELECT attempt_number, error_message, r.failure_class FROM forward_retry_logs l
			JOIN forward_records r ON r.id = l.record_id
			WHERE r.message_key = 'f-old' AND l.result_status = 'REQUEUED'`).Scan(&attempt, &msg, &class); err != nil {
			t.Fatal(err)
		}
		if attempt != 5 || msg != "requeued by alice (was FAILED after 5 attempts)" || class != nil {
			t.Errorf("audit row: attempt_number %d, message %q, class %v; want 5, who and the previous state, no class", attempt, msg, class)
		}
		log := b.operatorLog(t)
		if len(log) != 1 || log[0].Operator != "alice" || log[0].Action != "requeue" || log[0].Rows != 3 ||
			log[0].Filter != "status=FAILED failure_class=TRANSIENT" {
			t.Errorf("operator log %+v, want one requeue of 3 rows by alice with its filter", log)
		}
	})

	t.Run("IncludeRejectedAndInvalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, mixed...)
		out := b.mustRun(t, "requeue", "--include-rejected", "--operator", "bob")
		if lastLine(out) != "4 rows requeued" || strings.Contains(out, "REJECTED by") || !strings.Contains(out, "left out: 1 INVALID") {
			t.Fatalf("with --include-rejected: %q, want 4 rows and the INVALID one left out", out)
		}
		if s, _ := b.state(t, "f998"); s.Status != "PENDING" {
			t.Errorf("f998 (REJECTED) after --include-rejected: %+v", s)
		}
		var note string
		if err := b.pool.QueryRow(context.Background(), `SELECT l.error_message FROM forward_retry_logs l
			JOIN forward_records r ON r.id = l.record_id
			WHERE r.message_key = 'f998' AND l.result_status = 'REQUEUED'`).Scan(&note); err != nil || note != "requeued by bob (was FAILED after 1 attempt)" {
			t.Errorf("audit row of a row that made one attempt: %q (%v)", note, err)
		}
		out = b.mustRun(t, "requeue", "--include-invalid", "--operator", "bob")
		if lastLine(out) != "1 row requeued" {
			t.Fatalf("with --include-invalid: %q, want the INVALID row", out)
		}
		if log := b.operatorLog(t); len(log) != 2 || log[1].Filter != "status=FAILED failure_class=TRANSIENT,INVALID" || log[1].Rows != 1 {
			t.Errorf("operator log %+v", log)
		}
	})

	t.Run("OrderingKeysKeepOneHead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, row{key: "a1", status: "FAILED", class: "TRANSIENT"}, row{key: "a2", status: "FAILED", class: "TRANSIENT"},
			row{key: "b1", status: "FAILED", class: "TRANSIENT"}, row{key: "b2"}, row{key: "c1", status: "FAILED", class: "TRANSIENT"})
		ctx := context.Background()
		// Key A: two FAILED rows, the first blocking it. Key B: a FAILED row
		// and a later PENDING head. Key C: one FAILED row.
		for key, ordering := range map[string]string{"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C"} {
			if _, err := b.pool.Exec(ctx, "UPDATE forward_deliveries SET ordering_key = $2, order_blocked = ($1 = 'a1') WHERE message_key = $1", key, ordering); err != nil {
				t.Fatal(err)
			}
		}
		if out := b.mustRun(t, "requeue"); lastLine(out) != "4 rows requeued" {
			t.Fatalf("requeue: %q", out)
		}
		var heads, held, blocked int64
		heads = b.count(t, `SELECT count(*) FROM forward_records WHERE status = 'PENDING' AND NOT order_held`)
		held = b.count(t, `SELECT count(*) FROM forward_records WHERE order_held`)
		blocked = b.count(t, `SELECT count(*) FROM forward_records WHERE order_blocked`)
		if heads != 3 || held != 2 || blocked != 0 {
			t.Errorf("%d heads, %d held, %d blocked; want a1, b2 and c1 heads, a2 and b1 held, nothing blocked", heads, held, blocked)
		}
		for key, wantHeld := range map[string]bool{"a1": false, "a2": true, "b1": true, "b2": false, "c1": false} {
			if n := b.count(t, "SELECT count(*) FROM forward_records WHERE id = $1 AND order_held = $2", ids[key], wantHeld); n != 1 {
				t.Errorf("%s: order_held is not %v", key, wantHeld)
			}
		}
	})

	t.Run("DryRunOnlyCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, mixed...)
		out := b.mustRun(t, "requeue", "--dry-run", "--errcode", "999")
		if !strings.HasPrefix(out, "3 rows would be requeued (dry run, nothing changed): status=FAILED failure_class=TRANSIENT errcode=\"999\"\n") {
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
		{"ErrcodeLatestAttemptOnly", []string{"--errcode", "998", "--include-rejected"}, []string{"f998"}},
		{"ErrcodeOfRejectedRowsNeedsTheFlag", []string{"--errcode", "998"}, nil},
		{"Since", []string{"--since", "1d"}, []string{"f998-then-999", "f999-lease"}},
		{"SinceEveryClass", []string{"--since", "1d", "--include-rejected", "--include-invalid"},
			[]string{"f998", "f998-then-999", "f999-lease", "fmap"}},
		{"Keys", []string{"--key", "fmap", "--key", "f998", "--key", "pending"}, nil},
		{"KeysEveryClass", []string{"--key", "fmap", "--key", "f998", "--key", "pending", "--include-invalid", "--include-rejected"},
			[]string{"fmap", "f998"}},
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
			rows := fmt.Sprintf("%d rows", len(c.want))
			if len(c.want) == 1 {
				rows = "1 row"
			}
			if want := rows + " would be requeued"; !strings.HasPrefix(dry, want) {
				t.Errorf("dry run said %q, want %q", dry, want)
			}
			out := b.mustRun(t, append([]string{"requeue"}, c.args...)...)
			if want := rows + " requeued"; lastLine(out) != want {
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

	// Delivered rows chosen by a filter, not by key, are all sent again:
	// refused without --force, after saying how many.
	t.Run("SuccessWithoutKeyNeedsForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, append(mixed, row{key: "success-2", status: "SUCCESS", attempts: 1})...)
		for _, args := range [][]string{
			{"--status", "SUCCESS"},
			{"--status", "success,failed"},
			{"--status", "SUCCESS", "--since", "1d"},
			{"--status", "SUCCESS", "--errcode", "4"},
		} {
			out, err := b.run(t, append([]string{"requeue", "--operator", "alice"}, args...)...)
			var exit cli.ExitCoder
			if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(err.Error(), "--force") {
				t.Fatalf("requeue %v: %v (%q), want exit status 2 asking for --force", args, err, out)
			}
			if args[1] == "SUCCESS" && len(args) == 2 && (!strings.Contains(out, "2 rows would be requeued: status=SUCCESS\n") ||
				!strings.Contains(out, "2 of them SUCCESS: delivered already, they would be sent to the platform again") ||
				!strings.Contains(err.Error(), "would send 2 delivered messages to the platform again")) {
				t.Errorf("requeue %v said %q / %v, want the count of delivered rows", args, out, err)
			}
		}
		if n := b.count(t, "SELECT count(*) FROM forward_retry_logs WHERE result_status = 'REQUEUED'"); n != 0 {
			t.Fatalf("%d rows requeued without --force", n)
		}
		if log := b.operatorLog(t); len(log) != 0 {
			t.Errorf("a refused requeue was recorded: %+v", log)
		}
		if dry := b.mustRun(t, "requeue", "--status", "SUCCESS", "--dry-run"); !strings.Contains(dry, "2 of them SUCCESS") {
			t.Errorf("the dry run does not say the delivered rows would be sent again: %q", dry)
		}

		out := b.mustRun(t, "requeue", "--status", "SUCCESS", "--force", "--operator", "alice")
		if !strings.Contains(out, "2 of them SUCCESS: delivered already, they will be sent to the platform again") || lastLine(out) != "2 rows requeued" {
			t.Errorf("with --force: %q", out)
		}
		for _, key := range []string{"success", "success-2"} {
			if s, _ := b.state(t, key); s.Status != "PENDING" || s.Requeues != 1 {
				t.Errorf("%s after requeue --force: %+v", key, s)
			}
		}
		if log := b.operatorLog(t); len(log) != 1 || log[0].Filter != "status=SUCCESS --force" || log[0].Rows != 2 {
			t.Errorf("operator log %+v, want the forced requeue of 2 rows", log)
		}
	})

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
		out := b.mustRun(t, "requeue", "--status", "PENDING", "--batch-size", "2", "--operator", "dave")
		if out != "requeueing 7 rows: status=PENDING (operator dave)\n7 rows requeued\n" {
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
		conn := pgtest.Listen(t, b.pool, outboxdb.NotifyChannel)
		b.mustRun(t, "requeue")
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no notification after requeue: %v", err)
		}
		if n.Channel != outboxdb.NotifyChannel {
			t.Errorf("notified %q, want %q", n.Channel, outboxdb.NotifyChannel)
		}
	})

	// A message key is the camera's messageId, any string: one with a
	// comma was split into two keys, so --key "a,b" requeued the rows "a"
	// and "b", and never "a,b".
	t.Run("KeyWithACommaIsOneKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, row{key: "a,b", status: "FAILED", attempts: 5, class: "TRANSIENT"},
			row{key: "a", status: "FAILED", attempts: 5, class: "TRANSIENT"},
			row{key: "b", status: "FAILED", attempts: 5, class: "TRANSIENT"})
		if out := b.mustRun(t, "requeue", "--key", "a,b", "--dry-run"); !strings.HasPrefix(out, `1 row would be requeued (dry run, nothing changed): status=FAILED failure_class=TRANSIENT key="a,b"`) {
			t.Errorf("requeue --key a,b --dry-run:\n%s", out)
		}
		if out := b.mustRun(t, "requeue", "--key", "a,b", "--operator", "alice"); lastLine(out) != "1 row requeued" {
			t.Errorf("requeue --key a,b:\n%s", out)
		}
		for key, want := range map[string]string{"a,b": "PENDING", "a": "FAILED", "b": "FAILED"} {
			if s, _ := b.state(t, key); s.Status != want {
				t.Errorf("%s is %s after requeue --key a,b, want %s", key, s.Status, want)
			}
		}
		// Repeated, the flag still names several keys.
		if out := b.mustRun(t, "requeue", "--key", "a", "--key", "b", "--dry-run"); !strings.HasPrefix(out, "2 rows would be requeued") {
			t.Errorf("requeue --key a --key b --dry-run:\n%s", out)
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

// TestRequeueOperatorDefaultsToUser: without --operator the audit names
// $USER (not parallel: it sets the environment).
func TestRequeueOperatorDefaultsToUser(t *testing.T) {
	b := setup(t)
	b.insert(t, row{key: "f-old", status: "FAILED", class: "TRANSIENT"})
	t.Setenv("USER", "carol")
	b.mustRun(t, "requeue", "--dry-run")
	if log := b.operatorLog(t); len(log) != 0 {
		t.Errorf("a dry run was recorded: %+v", log)
	}
	b.mustRun(t, "requeue", "--key", "f-old")
	if log := b.operatorLog(t); len(log) != 1 || log[0].Operator != "carol" || log[0].Filter != `status=FAILED failure_class=TRANSIENT key="f-old"` {
		t.Errorf("operator log %+v, want one row by $USER", log)
	}
}
