package outboxdb_test

import (
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// TestCompensate: rows FAILED on transient errors are requeued once their
// delay has passed, at most the configured rounds; rows the platform
// refused and bad input never are.
func TestCompensate(t *testing.T) {
	t.Parallel()
	db := setupClaimTest(t)
	old := time.Hour
	ids := db.Insert(
		fixture.Row{Key: "transient-old", Status: "FAILED", FailureClass: "TRANSIENT", Attempts: 5, Age: old},
		fixture.Row{Key: "transient-new", Status: "FAILED", FailureClass: "TRANSIENT", Attempts: 5},
		fixture.Row{Key: "rejected", Status: "FAILED", FailureClass: "REJECTED", Attempts: 1, Age: old},
		fixture.Row{Key: "invalid", Status: "FAILED", FailureClass: "INVALID", Age: old},
		fixture.Row{Key: "done", Status: "SUCCESS", Age: old},
	)
	const rounds = 2
	n, err := outboxdb.Compensate(db.Ctx, db.Pool, rounds, 30*time.Minute, 1)
	if err != nil || n != 1 {
		t.Fatalf("Compensate = %d, %v; want the one old transient row (in batches of 1)", n, err)
	}
	s := db.State(ids[0])
	if s.Status != "PENDING" || s.AttemptCount != 0 || s.RequeueRounds != 1 || *s.DueInMs > 0 || s.FailureClass != nil || s.FailedAt != nil {
		t.Fatalf("requeued row %+v, want PENDING, due, attempts reset, no failure class or time, round 1", s)
	}
	logs := db.Logs(ids[0])
	if len(logs) != 1 || logs[0].Status != "REQUEUED" || logs[0].Attempt != 5 ||
		!strings.Contains(fixture.Str(logs[0].Error), "automatic compensation, round 1 of 2") {
		t.Fatalf("logs %+v", logs)
	}
	for _, id := range ids[1:4] {
		if s := db.State(id); s.Status != "FAILED" {
			t.Errorf("row %d requeued: %+v", id, s)
		}
	}

	// It fails again, twice: the second time it is frozen.
	for round := 2; round <= 3; round++ {
		db.Exec(`UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL, failure_class = 'TRANSIENT',
			failed_at = now() - interval '1 hour', attempt_count = 5 WHERE id = $1`, ids[0])
		n, err := outboxdb.Compensate(db.Ctx, db.Pool, rounds, 30*time.Minute, 100)
		if err != nil {
			t.Fatal(err)
		}
		if round == 2 && n != 1 {
			t.Fatalf("round 2 requeued %d", n)
		}
		if round == 3 && n != 0 {
			t.Fatalf("a row past its %d rounds was requeued", rounds)
		}
	}
	waiting, frozen, err := outboxdb.CompensationCounts(db.Ctx, db.Pool, rounds)
	if err != nil || waiting != 1 || frozen != 1 {
		t.Fatalf("counts waiting %d frozen %d (%v); want the new transient row waiting and the old one frozen", waiting, frozen, err)
	}
	// The most rounds a row may be given (FAILED_REQUEUE_ROUNDS' largest)
	// takes it again.
	if n, err := outboxdb.Compensate(db.Ctx, db.Pool, outboxdb.MaxRequeueRounds, 30*time.Minute, 100); err != nil || n != 1 {
		t.Fatalf("Compensate with the most rounds = %d, %v; want the frozen row", n, err)
	}
	if logs := db.Logs(ids[0]); !strings.Contains(fixture.Str(logs[len(logs)-1].Error), "round 3 of 2147483647") {
		t.Fatalf("last log %+v", logs[len(logs)-1])
	}
}
