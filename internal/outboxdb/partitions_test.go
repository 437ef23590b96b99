package outboxdb_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// dropPartitions drops, as the superuser the tests connect as, the
// partitions whose lower bound is at or after from (all with the zero
// time), as if they had never been made.
func dropPartitions(t *testing.T, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	ctx := context.Background()
	ps, err := outboxdb.ListPartitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Lower.Before(from) {
			continue
		}
		drop := "DROP TABLE " + pgx.Identifier{p.Messages}.Sanitize() + ", " + pgx.Identifier{p.RetryLogs}.Sanitize()
		if _, err := pool.Exec(ctx, drop); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "DELETE FROM forward_partitions WHERE lower = $1", p.Lower); err != nil {
			t.Fatal(err)
		}
	}
}

// checkContiguous fails unless the partitions tile [from, to) without a gap,
// each width wide.
func checkContiguous(t *testing.T, ps []outboxdb.Partition, from, to time.Time, width time.Duration) {
	t.Helper()
	at := from
	for _, p := range ps {
		if p.Upper.Sub(p.Lower) != width {
			t.Errorf("partition %s is %s wide, want %s", p.Label(), p.Upper.Sub(p.Lower), width)
		}
		if !p.Lower.Equal(at) {
			t.Errorf("partition %s starts at %s, want %s (a gap or an overlap)", p.Label(), p.Lower.UTC(), at.UTC())
		}
		at = p.Upper
	}
	if !at.Equal(to) {
		t.Errorf("partitions end at %s, want %s", at.UTC(), to.UTC())
	}
}

func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

func TestPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	day := 24 * time.Hour

	t.Run("EnsureKeepsTheCurrentAndThreeAhead", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		today := dbNow(t, pool).UTC().Truncate(day)
		// The migration made today and three days ahead.
		if n, err := outboxdb.EnsurePartitions(ctx, pool, day); err != nil || n != 0 {
			t.Fatalf("after the migration: %d created, %v; want none", n, err)
		}
		dropPartitions(t, pool, today.Add(day))
		n, err := outboxdb.EnsurePartitions(ctx, pool, day)
		if err != nil || n != 3 {
			t.Fatalf("%d created, %v; want the three days ahead", n, err)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		checkContiguous(t, ps, today, today.Add(4*day), day)
		if n, err := outboxdb.EnsurePartitions(ctx, pool, day); err != nil || n != 0 {
			t.Fatalf("again: %d created, %v; want none", n, err)
		}
		// A covered range is left alone whatever the width asked for.
		if n, err := outboxdb.EnsurePartitions(ctx, pool, 6*time.Hour); err != nil || n != 0 {
			t.Fatalf("6h over daily partitions: %d created, %v; want none", n, err)
		}
	})

	t.Run("NarrowestWidth", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		dropPartitions(t, pool, time.Time{})
		n, err := outboxdb.EnsurePartitions(ctx, pool, time.Hour)
		if err != nil || n != 4 {
			t.Fatalf("%d created, %v; want the current hour and three ahead", n, err)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil || len(ps) != 4 {
			t.Fatalf("%d partitions, %v", len(ps), err)
		}
		checkContiguous(t, ps, ps[0].Lower, ps[0].Lower.Add(4*time.Hour), time.Hour)
		if now := dbNow(t, pool); now.Before(ps[0].Lower) || !now.Before(ps[0].Upper) {
			t.Errorf("the first partition %s does not hold now (%s)", ps[0].Label(), now.UTC())
		}
		// Rows go in; the partition is named after its start.
		db := fixture.New(t, pool)
		db.InsertDue("hourly", 3)
		var table string
		if err := pool.QueryRow(ctx, "SELECT c.relname::text FROM forward_messages m JOIN pg_class c ON c.oid = m.tableoid LIMIT 1").Scan(&table); err != nil || table != ps[0].Messages {
			t.Errorf("row stored in %s (%v), want %s", table, err, ps[0].Messages)
		}
	})

	t.Run("WidestWidth", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		dropPartitions(t, pool, time.Time{})
		week := 7 * day
		if n, err := outboxdb.EnsurePartitions(ctx, pool, week); err != nil || n != 4 {
			t.Fatalf("%d created, %v; want four weeks", n, err)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		checkContiguous(t, ps, ps[0].Lower, ps[0].Lower.Add(4*week), week)
	})

	t.Run("WidthsOutsideTheRangeAreRefused", func(t *testing.T) {
		t.Parallel()
		for _, s := range []string{"59m", "90m", "7d1h", "8d", "0s", "1 day"} {
			if _, err := outboxdb.ParsePartitionWidth(s); err == nil {
				t.Errorf("width %q accepted", s)
			}
		}
		for s, want := range map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "1d": day, "36h": 36 * time.Hour, "7d": 7 * day} {
			if d, err := outboxdb.ParsePartitionWidth(s); err != nil || d != want {
				t.Errorf("width %q: %v, %v; want %v", s, d, err, want)
			}
		}
		pool := pgtest.NewPool(t)
		if _, err := outboxdb.EnsurePartitions(ctx, pool, 30*time.Minute); err == nil {
			t.Error("EnsurePartitions accepted 30m")
		}
	})

	t.Run("ConcurrentEnsuresMakeEachPartitionOnce", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		// Eight callers at once over the same far-future month, half of
		// them with daily and half with 6-hour partitions: no error, no
		// overlap (the registry's exclusion constraint would refuse one),
		// no gap.
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
			errs    []error
		)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				width := "1 day"
				if i%2 == 1 {
					width = "6 hours"
				}
				var n int
				err := pool.QueryRow(ctx, `SELECT forward_partition_ensure(date_trunc('day', now()) + interval '100 days',
					date_trunc('day', now()) + interval '130 days', $1::interval)`, width).Scan(&n)
				mu.Lock()
				defer mu.Unlock()
				created += n
				if err != nil {
					errs = append(errs, err)
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		start := dbNow(t, pool).UTC().Truncate(day).Add(100 * day)
		var far []outboxdb.Partition
		for _, p := range ps {
			if !p.Lower.Before(start) {
				far = append(far, p)
			}
		}
		if created != len(far) {
			t.Errorf("callers say they created %d partitions, the registry has %d", created, len(far))
		}
		at := start
		for _, p := range far {
			if !p.Lower.Equal(at) {
				t.Fatalf("partition %s starts at %s, want %s", p.Label(), p.Lower.UTC(), at.UTC())
			}
			at = p.Upper
		}
		if want := start.Add(30 * day); !at.Equal(want) {
			t.Errorf("partitions end at %s, want %s", at.UTC(), want.UTC())
		}
	})

	t.Run("InsertsCrossABoundary", func(t *testing.T) {
		t.Parallel()
		// A boundary a few seconds from now, inserts running across it:
		// with the partitions kept ahead (what the dispatchers do), and
		// with none after the boundary (no dispatcher running), where the
		// insert that meets the boundary creates the next one itself.
		for _, ahead := range []bool{true, false} {
			pool := pgtest.NewPool(t)
			dropPartitions(t, pool, time.Time{})
			var edge time.Time
			if err := pool.QueryRow(ctx, "SELECT now() + interval '3 seconds'").Scan(&edge); err != nil {
				t.Fatal(err)
			}
			// The current partition, an hour wide, ends at the edge.
			for _, parent := range []string{"forward_messages", "forward_retry_logs"} {
				db := fixture.New(t, pool)
				db.Exec("CREATE TABLE " + parent + "_edge (LIKE " + parent + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
				// DDL takes no parameters: the bounds as literals.
				db.Exec(fmt.Sprintf("ALTER TABLE %[1]s ATTACH PARTITION %[1]s_edge FOR VALUES FROM ('%[2]s') TO ('%[3]s')",
					parent, edge.Add(-time.Hour).UTC().Format(time.RFC3339Nano), edge.UTC().Format(time.RFC3339Nano)))
			}
			if _, err := pool.Exec(ctx, `INSERT INTO forward_partitions (lower, upper, messages, retry_logs)
				VALUES ($1, $2, 'forward_messages_edge', 'forward_retry_logs_edge')`, edge.Add(-time.Hour), edge); err != nil {
				t.Fatal(err)
			}
			if ahead {
				if n, err := outboxdb.EnsurePartitions(ctx, pool, time.Hour); err != nil || n < 3 {
					t.Fatalf("ensure ahead: %d created, %v", n, err)
				}
			}
			before, err := outboxdb.ListPartitions(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{{MessageKey: fmt.Sprintf("edge-%d", i),
					APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending}})
				if err != nil || c.Pending != 1 {
					t.Fatalf("ahead %v: insert %d around the boundary: %+v, %v", ahead, i, c, err)
				}
				if dbNow(t, pool).After(edge.Add(300 * time.Millisecond)) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			var beforeEdge, afterEdge, all int
			if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE m.tableoid = 'forward_messages_edge'::regclass),
					count(*) FILTER (WHERE m.created_at >= $1), count(*)
				FROM forward_messages m`, edge).Scan(&beforeEdge, &afterEdge, &all); err != nil {
				t.Fatal(err)
			}
			if beforeEdge == 0 || afterEdge == 0 || beforeEdge+afterEdge != all {
				t.Fatalf("ahead %v: %d rows before the boundary, %d after, %d in all; want rows on both sides (a slow setup misses the boundary: rerun)",
					ahead, beforeEdge, afterEdge, all)
			}
			after, err := outboxdb.ListPartitions(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case ahead && len(after) != len(before):
				t.Errorf("partitions kept ahead, yet the inserts created %d", len(after)-len(before))
			case !ahead && len(after) <= len(before):
				t.Errorf("no partition after the boundary, and the inserts created none")
			}
			if !after[1].Lower.Equal(edge) {
				t.Errorf("ahead %v: the partition after the boundary starts at %s, want %s", ahead, after[1].Lower.UTC(), edge.UTC())
			}
		}
	})

	t.Run("InsertAfterALongStop", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		// The service stopped twelve days ago: its partitions ahead ended
		// nine days ago.
		dropPartitions(t, pool, time.Time{})
		if _, err := pool.Exec(ctx, `SELECT forward_partition_ensure(now() - interval '12 days', now() - interval '9 days',
			interval '1 day')`); err != nil {
			t.Fatal(err)
		}
		old, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil || len(old) != 4 {
			t.Fatalf("%d old partitions, %v", len(old), err)
		}
		// The first insert after the restart, before any dispatcher runs.
		c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{{MessageKey: "back", APIType: outboxdb.APITypeHeartbeat,
			KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending}})
		if err != nil || c.Pending != 1 {
			t.Fatalf("insert after a long stop: %+v, %v", c, err)
		}
		// The dispatcher, once it runs, keeps three days ahead again; the
		// days of the stop stay without partitions (no row needs them).
		if _, err := outboxdb.EnsurePartitions(ctx, pool, day); err != nil {
			t.Fatal(err)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		today := dbNow(t, pool).UTC().Truncate(day)
		checkContiguous(t, ps[len(old):], today, today.Add(4*day), day)
		for i, p := range old {
			if !p.Lower.Equal(ps[i].Lower) || !p.Upper.Equal(ps[i].Upper) || p.Messages != ps[i].Messages {
				t.Errorf("old partition %s became %s", p.Label(), ps[i].Label())
			}
		}
		var table string
		if err := pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM forward_messages WHERE message_key = 'back'").Scan(&table); err != nil || table != ps[len(old)].Messages {
			t.Errorf("row stored in %s (%v), want today's partition %s", table, err, ps[len(old)].Messages)
		}
	})

	t.Run("InsertCreatesAMissingPartition", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		// No partition at all: no dispatcher has run on this database.
		dropPartitions(t, pool, time.Time{})
		c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{
			{MessageKey: "first", APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending},
			{MessageKey: "bad", APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`x`), Status: outboxdb.StatusFailed, LastError: "not JSON"},
		})
		if err != nil {
			t.Fatalf("insert with no partition: %v", err)
		}
		if c != (outboxdb.InsertCounts{Pending: 1, Failed: 1}) {
			t.Fatalf("inserted %+v, want both", c)
		}
		ps, err := outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		// The current day and the next, a day wide (no partition to
		// take the width from).
		today := dbNow(t, pool).UTC().Truncate(day)
		checkContiguous(t, ps, today, today.Add(2*day), day)
		db := fixture.New(t, pool)
		if n := db.Count("message_key IN ('first', 'bad')"); n != 2 {
			t.Errorf("%d rows stored, want 2", n)
		}

		// The width of the newest partition is kept: hourly partitions
		// make hourly ones.
		dropPartitions(t, pool, time.Time{})
		if _, err := pool.Exec(ctx, `SELECT forward_partition_ensure(now() - interval '5 hours', now() - interval '1 hour',
			interval '1 hour')`); err != nil {
			t.Fatal(err)
		}
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{
			{MessageKey: "second", APIType: outboxdb.APITypeHeartbeat, KafkaTopic: "t", Payload: []byte(`{}`), Status: outboxdb.StatusPending},
		}); err != nil {
			t.Fatalf("insert with the current hour missing: %v", err)
		}
		ps, err = outboxdb.ListPartitions(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		last := ps[len(ps)-1]
		if last.Upper.Sub(last.Lower) != time.Hour {
			t.Errorf("partition made by the insert: %s, want an hour wide", last.Label())
		}
	})
}
