package outboxdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestOnlyTheInsertWaitsForTheWALFlush, on a server with production
// durability: the insert that precedes a Kafka offset commit is flushed to
// disk before it returns (one WAL flush each), while claims, lease renewals
// and result writes commit without waiting (docs/architecture.md, "What may
// commit asynchronously"): what a crash loses of them only makes a message
// be sent again.
func TestOnlyTheInsertWaitsForTheWALFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := pgtest.StartDurableCluster(t)
	pool, err := outboxdb.Open(ctx, pgtest.NewDBOn(t, cluster), outboxdb.PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	syncs := func() int64 {
		t.Helper()
		// A backend publishes its statistics when it goes idle, at most once
		// a second unless asked: ask, so that the count is current.
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := pool.QueryRow(ctx, "SELECT wal_sync FROM pg_stat_wal").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const rounds = 40
	measure := func(what string, each func(i int)) int64 {
		t.Helper()
		// Let the WAL writer flush what earlier steps left, so that it does
		// not count here.
		time.Sleep(300 * time.Millisecond)
		before := syncs()
		for i := range rounds {
			each(i)
		}
		n := syncs() - before
		t.Logf("%s: %d WAL flushes for %d statements", what, n, rounds)
		return n
	}

	var claimed []outboxdb.Record
	inserts := measure("insert", func(i int) {
		rec := outboxdb.NewRecord{MessageKey: fmt.Sprintf("k-%d", i), APIType: outboxdb.APITypeHeartbeat,
			KafkaTopic: "t", KafkaOffset: int64(i), Payload: []byte(`{}`), Status: outboxdb.StatusPending}
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{rec}); err != nil {
			t.Fatal(err)
		}
	})
	claims := measure("claim", func(int) {
		res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: 1, Lease: time.Minute, Claimer: "me"})
		if err != nil || len(res.Claimed) != 1 {
			t.Fatalf("claim: %v %+v", err, res)
		}
		claimed = append(claimed, res.Claimed[0])
	})
	renewals := measure("lease renewal", func(i int) {
		if _, err := outboxdb.RenewLeases(ctx, pool, []outboxdb.ClaimRef{claimed[i].Ref()}, time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	results := measure("result write", func(i int) {
		if _, err := outboxdb.RecordResults(ctx, pool, []outboxdb.Result{{ID: claimed[i].ID, ClaimToken: claimed[i].ClaimToken,
			Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}}, outboxdb.RecordOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if inserts < rounds {
		t.Errorf("%d WAL flushes for %d inserts: an insert returned before its rows were on disk", inserts, rounds)
	}
	for what, n := range map[string]int64{"claims": claims, "renewals": renewals, "result writes": results} {
		if n > rounds/4 {
			t.Errorf("%d WAL flushes for %d %s: they wait for the disk", n, rounds, what)
		}
	}
	assertSettingNotLeaked(t, pool)

	// An administrator turned synchronous_commit off for the database: the
	// insert still waits for the disk, since the Kafka offsets of its
	// messages are committed once it returns.
	pgtest.SetForDatabase(t, pool, "synchronous_commit", "off")
	offInserts := measure("insert, synchronous_commit off for the database", func(i int) {
		rec := outboxdb.NewRecord{MessageKey: fmt.Sprintf("off-%d", i), APIType: outboxdb.APITypeHeartbeat,
			KafkaTopic: "t", KafkaOffset: int64(rounds + i), Payload: []byte(`{}`), Status: outboxdb.StatusPending}
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{rec}); err != nil {
			t.Fatal(err)
		}
	})
	if offInserts < rounds {
		t.Errorf("%d WAL flushes for %d inserts with synchronous_commit off for the database: an insert returned before its rows were on disk", offInserts, rounds)
	}
}

// assertSettingNotLeaked: the asynchronous commit is local to each
// statement's transaction, not left on the pooled connection for the next
// statement (an insert).
func assertSettingNotLeaked(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var v string
	if err := pool.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "on" {
		t.Fatalf("synchronous_commit is %q on the pooled connection after the asynchronous statements", v)
	}
}
