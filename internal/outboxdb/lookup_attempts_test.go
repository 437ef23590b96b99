package outboxdb_test

import (
	"context"
	"testing"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestAttemptsNumberedOverTheRowsLife: a row refused for good, requeued and
// then delivered shows its attempts as #1, REQUEUED after 1, #2, though
// the requeue reset attempt_count (a fresh budget) and the delivery's log
// stores 1 again.
func TestAttemptsNumberedOverTheRowsLife(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fixture.New(t, pgtest.NewPool(t))
	id := db.Insert(fixture.Row{Key: "refused-then-delivered"})[0]

	attempt := func(status outboxdb.Status) {
		t.Helper()
		rows := db.ClaimN(1)
		if len(rows) != 1 || rows[0].ID != id {
			t.Fatalf("claimed %+v, want row %d", rows, id)
		}
		class := ""
		if status == outboxdb.StatusFailed {
			class = string(outboxdb.ClassRejected)
		}
		if _, err := outboxdb.RecordResults(ctx, db.Pool, []outboxdb.Result{{ID: id, ClaimToken: rows[0].ClaimToken,
			Status: status, Sent: true, Class: outboxdb.FailureClass(class)}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	attempt(outboxdb.StatusFailed)
	if n, err := outboxdb.Requeue(ctx, db.Pool, outboxdb.RequeueFilter{Keys: []string{"refused-then-delivered"},
		Classes: []outboxdb.FailureClass{outboxdb.ClassRejected}}, outboxdb.RequeueOptions{Note: "requeued by test"}); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	attempt(outboxdb.StatusSuccess)

	v, err := outboxdb.ShowRecordByID(ctx, db.Pool, id, outboxdb.LookupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		n      int
		result string
	}
	var got []entry
	for _, a := range v.Attempts {
		got = append(got, entry{a.AttemptNumber, a.ResultStatus})
	}
	want := []entry{{1, "FAILED"}, {1, "REQUEUED"}, {2, "SUCCESS"}}
	if len(got) != len(want) {
		t.Fatalf("attempts %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("attempts %v, want %v", got, want)
		}
	}
}
