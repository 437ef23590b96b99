package outboxdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestReadRates: the console's recent rates count the messages created in
// the last minute and ten minutes (an older one and one delivered long ago
// left out) and the attempts by outcome, and say when the cap on rows read
// cut the ten minutes short, so that the figures are lower bounds.
func TestReadRates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fixture.New(t, pgtest.NewPool(t))
	// Oldest first, as ids are handed out: an hour old and delivered then,
	// 5 minutes old and PENDING after a failed attempt, then three new
	// ones (two delivered just now).
	db.Insert(fixture.Row{Key: "old", Status: "SUCCESS", Age: time.Hour})
	ids := db.Insert(fixture.Row{Key: "five-minutes", Age: 5 * time.Minute, Attempts: 1})
	db.Exec(`INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, attempted_at)
		SELECT id, created_at, 1, 'PENDING', now() - interval '4 minutes' FROM forward_messages WHERE id = $1`, ids[0])
	db.Insert(fixture.Row{Key: "new-1", Status: "SUCCESS"}, fixture.Row{Key: "new-2", Status: "SUCCESS"},
		fixture.Row{Key: "new-3"})

	want := outboxdb.Rates{Created1m: 3, Created10m: 4, Delivered1m: 2, Delivered10m: 2, Failed1m: 0, Failed10m: 1}
	if r, err := outboxdb.ReadRates(ctx, db.Pool); err != nil || r != want {
		t.Errorf("ReadRates = %+v, %v; want %+v", r, err, want)
	}
	// Three rows a side: the three newest messages, all in the last minute,
	// and the message below them in the ten minutes; the three newest
	// attempts (new-2, new-1, the failed one), all in the ten minutes.
	want = outboxdb.Rates{Created1m: 3, Created10m: 3, CreatedCapped: true, Delivered1m: 2, Delivered10m: 2,
		Failed1m: 0, Failed10m: 1, AttemptsCapped: true}
	if r, err := outboxdb.ReadRatesCapped(ctx, db.Pool, 3); err != nil || r != want {
		t.Errorf("ReadRatesCapped(3) = %+v, %v; want %+v", r, err, want)
	}
	// Four a side: every message of the ten minutes is read; the message
	// below them is an hour old. The fourth attempt is the old one.
	want = outboxdb.Rates{Created1m: 3, Created10m: 4, Delivered1m: 2, Delivered10m: 2, Failed1m: 0, Failed10m: 1}
	if r, err := outboxdb.ReadRatesCapped(ctx, db.Pool, 4); err != nil || r != want {
		t.Errorf("ReadRatesCapped(4) = %+v, %v; want %+v", r, err, want)
	}
}
