package outboxdb_test

import (
	"context"
	"testing"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The stats, requeue and purge queries are tested through their commands in
// internal/outboxcli; this covers the dev stack's progress count.
func TestReadProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	db := fixture.New(t, pool)
	insert := func(key, status string, attempts int) {
		t.Helper()
		db.Insert(fixture.Row{Key: key, APIType: "HEARTBEAT", Status: status, Attempts: attempts})
	}
	insert("before", "PENDING", 0)
	mark, err := outboxdb.MaxRecordID(ctx, pool)
	if err != nil || mark == 0 {
		t.Fatalf("MaxRecordID = %d, %v", mark, err)
	}
	insert("waiting", "PENDING", 0)
	insert("retrying", "PENDING", 2)
	insert("claimed", "IN_PROGRESS", 1)
	insert("ok1", "SUCCESS", 1)
	insert("ok2", "SUCCESS", 3)
	insert("bad", "FAILED", 0)
	p, err := outboxdb.ReadProgress(ctx, pool, mark)
	if err != nil {
		t.Fatal(err)
	}
	want := outboxdb.Progress{Persisted: 6, Waiting: 1, Retrying: 1, InProgress: 1, Delivered: 2, Failed: 1}
	if p != want {
		t.Errorf("progress %+v, want %+v (the row before the mark left out)", p, want)
	}
}
