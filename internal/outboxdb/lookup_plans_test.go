package outboxdb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The lookup plan tests fill the outbox with 1 M messages spread over 30
// days (newest last, ids 1 to 1 000 000 in creation order), so over 31
// daily partitions of about 33 000 messages each:
//
//   - 80 % vehicle events with a plate (200 000 plates, about 4 rows each),
//     20 % heartbeats without one;
//   - 200 parks of 50 berths (berth codes repeat in every park), 2000
//     devices; park P0999 has only the 5000 oldest rows, like a park that
//     stopped sending a month ago: a search for it must not read the newer
//     995 000 rows first;
//   - 2 % FAILED (half REJECTED by errcode 998, half TRANSIENT after 999),
//     1 % PENDING plus the newest 1000 rows (a backlog), each with a delivery
//     row; the rest delivered (SUCCESS: no delivery row);
//   - every message has an attempt: SUCCESS for the delivered ones (every
//     50th with errcode 4, duplicate), FAILED or PENDING with 998 or 999.
const (
	millionMessages = `
INSERT INTO forward_messages (id, created_at, message_key, api_type, kafka_topic, kafka_partition,
    kafka_offset, payload, plate_no, park_code, berth_code, device_id)
SELECT g, now() - (1000000 - g) * interval '2.6 second', 'key-' || g,
       CASE WHEN g % 5 = 0 THEN 'HEARTBEAT' ELSE 'VEHICLE_EVENT' END,
       'device-vehicle-event', g % 3, g, '\x7b7d'::bytea,
       CASE WHEN g % 5 <> 0 THEN '粤B' || lpad((g::bigint * 7919 % 200000)::text, 6, '0') END,
       CASE WHEN g <= 5000 THEN 'P0999' ELSE 'P' || (1000 + g % 200) END,
       'B-' || lpad(((g / 200) % 50)::text, 3, '0'),
       'CAM-' || lpad((g % 2000)::text, 4, '0')
FROM generate_series(1, 1000000) AS g`

	millionDeliveries = `
INSERT INTO forward_deliveries (id, created_at, message_key, status, attempt_count, next_retry_at,
    payload_size, last_error, updated_at, failure_class, failed_at)
SELECT m.id, m.created_at, m.message_key, s.status,
       CASE s.status WHEN 'FAILED' THEN 5 ELSE 2 END,
       CASE WHEN s.status = 'PENDING' THEN m.created_at + interval '1 minute' END, 2,
       CASE WHEN s.status = 'FAILED' THEN CASE WHEN m.id % 2 = 0
           THEN 'not retried (rules[1] no_retry): http 200: {"errcode":"998"}'
           ELSE 'http 200: {"errcode":"999"}' END END,
       m.created_at,
       CASE WHEN s.status = 'FAILED' THEN CASE WHEN m.id % 2 = 0 THEN 'REJECTED' ELSE 'TRANSIENT' END END,
       CASE WHEN s.status = 'FAILED' THEN m.created_at END
FROM forward_messages m,
     LATERAL (SELECT CASE WHEN m.id > 999000 OR m.id % 100 = 2 THEN 'PENDING' ELSE 'FAILED' END AS status) s
WHERE m.id > 999000 OR m.id % 100 < 3`

	millionLogs = `
INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status,
    platform_errcode, attempted_at, attempted_by)
SELECT m.id, m.created_at, coalesce(d.attempt_count, 1), coalesce(d.status, 'SUCCESS'), 200,
       CASE WHEN d.failure_class = 'REJECTED' THEN '998'
            WHEN d.status IS NOT NULL THEN '999'
            WHEN m.id % 50 = 0 THEN '4' END,
       m.created_at, 'fill'
FROM forward_messages m
LEFT JOIN forward_deliveries d ON d.id = m.id`
)

// millionPool is a private copy of the data set above, written and
// analysed once for the tests that plan against it. The tables' plain
// indexes are dropped while the rows go in and built again from their own
// definitions after: PostgreSQL builds an index over a million rows for
// less CPU than it spends keeping it current row by row (alone, the fill
// took 25 s with them in place, 18 s without). Unique indexes stay: they
// check the data set as it goes in, and those behind a constraint cannot
// be dropped on their own.
func millionPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.NewFilledPool(t, "million", func(ctx context.Context, pool *pgxpool.Pool) error {
		if _, err := pool.Exec(ctx, `SELECT forward_partition_ensure(now() - interval '32 days', now() + interval '1 day', interval '1 day')`); err != nil {
			return fmt.Errorf("creating the partitions: %w", err)
		}
		var defs []string
		err := pool.QueryRow(ctx, `
			SELECT coalesce(array_agg(pg_get_indexdef(i.indexrelid) ORDER BY i.indexrelid), '{}')
			FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
			WHERE c.relname IN ('forward_messages', 'forward_deliveries', 'forward_retry_logs')
			  AND NOT i.indisunique`).Scan(&defs)
		if err != nil {
			return fmt.Errorf("reading the index definitions: %w", err)
		}
		var drop, build []string
		for _, def := range defs {
			// CREATE INDEX name ON ONLY table ...: the parent's index; built
			// on the parent, it is built on every partition too.
			drop = append(drop, "DROP INDEX "+strings.Fields(def)[2])
			build = append(build, strings.Replace(def, " ON ONLY ", " ON ", 1))
		}
		indexes := func() (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename ~ '^forward_(messages|deliveries|retry_logs)'`).Scan(&n)
			return n, err
		}
		before, err := indexes()
		if err != nil {
			return err
		}
		steps := slices.Concat(drop, []string{millionMessages, millionDeliveries, millionLogs}, build,
			[]string{"ANALYZE forward_messages", "ANALYZE forward_deliveries", "ANALYZE forward_retry_logs"})
		for _, sql := range steps {
			if _, err := pool.Exec(ctx, sql); err != nil {
				return fmt.Errorf("filling the outbox: %s: %w", sql, err)
			}
		}
		if after, err := indexes(); err != nil || after != before {
			return fmt.Errorf("%d indexes on the outbox's tables and partitions before the fill, %d after (%v)", before, after, err)
		}
		return nil
	})
}

// TestLookupPlans: every search `outbox find` and the console can run, and
// `outbox show` by key and by id, reach their rows through an index with 1 M
// messages in 31 daily partitions: no sequential scan of a table that holds
// rows, the index each search is meant to walk is the one in the plan (on
// every partition, merged), a search with a time filter reads no partition
// outside its range, and the attempt logs of a row are read in its
// partition only. One database is shared by the subtests; it takes most of
// the test's time to fill.
func TestLookupPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	pool := millionPool(t)
	t.Logf("1 M messages ready in %v", time.Since(start).Round(time.Millisecond))
	tables := readPlanTables(t, pool)
	filled := 0
	for name := range tables.partitions {
		if strings.HasPrefix(name, "forward_messages_") && !tables.empty[name] {
			filled++
		}
	}
	if filled < 31 {
		t.Fatalf("the messages fill %d partitions, want 31", filled)
	}

	now := time.Now()
	day := 24 * time.Hour
	for _, c := range []struct {
		name   string
		filter outboxdb.FindFilter
		// index is the index the search must walk.
		index string
		// check, when set, checks each row found.
		check func(outboxdb.FoundRow) bool
	}{
		// Rows 4242, 204242, ... 804242 (7919 × g mod 200000 = 192398).
		{"Plate", outboxdb.FindFilter{Plate: "粤B192398"}, "forward_messages_plate_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.PlateNo) == "粤B192398" }},
		{"Park", outboxdb.FindFilter{Park: "P1050"}, "forward_messages_park_id_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P1050" }},
		{"ParkWithOnlyOldRows", outboxdb.FindFilter{Park: "P0999"}, "forward_messages_park_id_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P0999" }},
		{"ParkAndBerth", outboxdb.FindFilter{Park: "P1050", Berth: "B-010"}, "forward_messages_park_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P1050" && deref(r.BerthCode) == "B-010" }},
		{"Berth", outboxdb.FindFilter{Berth: "B-010"}, "forward_messages_berth_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.BerthCode) == "B-010" }},
		{"Device", outboxdb.FindFilter{Device: "CAM-0042"}, "forward_messages_device_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.DeviceID) == "CAM-0042" }},
		{"StatusFailed", outboxdb.FindFilter{Status: outboxdb.StatusFailed}, "forward_deliveries_status_idx",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusFailed }},
		{"StatusPending", outboxdb.FindFilter{Status: outboxdb.StatusPending}, "forward_deliveries_status_idx",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusPending }},
		{"StatusSuccess", outboxdb.FindFilter{Status: outboxdb.StatusSuccess}, "forward_messages_pkey",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusSuccess && r.SucceededAt != nil }},
		{"Errcode", outboxdb.FindFilter{Errcode: "998"}, "forward_retry_logs_errcode_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.LastErrcode) == "998" }},
		{"ErrcodeDuplicate", outboxdb.FindFilter{Errcode: "4"}, "forward_retry_logs_errcode_idx",
			func(r outboxdb.FoundRow) bool {
				return deref(r.LastErrcode) == "4" && r.Status == outboxdb.StatusSuccess
			}},
		{"ErrcodeFailedUntil", outboxdb.FindFilter{Errcode: "999", Status: outboxdb.StatusFailed, Until: now.Add(-20 * day)},
			"forward_retry_logs_errcode_idx",
			func(r outboxdb.FoundRow) bool {
				return deref(r.LastErrcode) == "999" && r.Status == outboxdb.StatusFailed && r.CreatedAt.Before(now.Add(-20*day))
			}},
		{"Since", outboxdb.FindFilter{Since: now.Add(-day)}, "forward_messages_pkey",
			func(r outboxdb.FoundRow) bool { return !r.CreatedAt.Before(now.Add(-day)) }},
		{"Until", outboxdb.FindFilter{Until: now.Add(-20 * day)}, "forward_messages_pkey",
			func(r outboxdb.FoundRow) bool { return r.CreatedAt.Before(now.Add(-20 * day)) }},
		{"SinceAndUntil", outboxdb.FindFilter{Since: now.Add(-10 * day), Until: now.Add(-9 * day)},
			"forward_messages_pkey", func(r outboxdb.FoundRow) bool {
				return !r.CreatedAt.Before(now.Add(-10*day)) && r.CreatedAt.Before(now.Add(-9*day))
			}},
		{"StatusFailedSince", outboxdb.FindFilter{Status: outboxdb.StatusFailed, Since: now.Add(-2 * day)},
			"forward_deliveries_status_idx", func(r outboxdb.FoundRow) bool {
				return r.Status == outboxdb.StatusFailed && !r.CreatedAt.Before(now.Add(-2*day))
			}},
		{"PlateStatusAndSince", outboxdb.FindFilter{Plate: "粤B192398", Status: outboxdb.StatusSuccess, Since: now.Add(-30 * day)},
			"forward_messages_plate_idx", nil},
		{"ParkPendingSince", outboxdb.FindFilter{Park: "P1050", Status: outboxdb.StatusPending, Since: now.Add(-day)},
			"forward_messages_park_id_idx", func(r outboxdb.FoundRow) bool {
				return deref(r.ParkCode) == "P1050" && r.Status == outboxdb.StatusPending
			}},
		{"DeviceAndErrcode", outboxdb.FindFilter{Device: "CAM-0002", Errcode: "999"}, "forward_messages_device_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.LastErrcode) == "999" }},
		{"Nothing", outboxdb.FindFilter{}, "forward_messages_pkey", nil},
		{"UnknownPlate", outboxdb.FindFilter{Plate: "no such plate"}, "forward_messages_plate_idx", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := outboxdb.ExplainFind(ctx, pool, c.filter, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tables.checkPlan(t, plan, c.index)
			if !c.filter.Since.IsZero() || !c.filter.Until.IsZero() {
				run, err := outboxdb.ExplainAnalyzeFind(ctx, pool, c.filter)
				if err != nil {
					t.Fatal(err)
				}
				tables.checkReadInRange(t, run, c.filter.Since, c.filter.Until)
			}

			start := time.Now()
			rows, err := outboxdb.Find(ctx, pool, c.filter, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d rows in %v", len(rows), time.Since(start).Round(time.Microsecond))
			if c.check != nil && len(rows) == 0 {
				t.Errorf("found nothing")
			}
			for _, r := range rows {
				if c.check != nil && !c.check(r) {
					t.Errorf("row %d does not match the filter: %+v", r.ID, r)
				}
			}
		})
	}

	// Newest first, within one search, merged across partitions.
	t.Run("NewestFirst", func(t *testing.T) {
		rows, err := outboxdb.Find(ctx, pool, outboxdb.FindFilter{Park: "P1050", Limit: 1000}, outboxdb.LookupOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1000 || !slices.IsSortedFunc(rows, func(a, b outboxdb.FoundRow) int { return int(b.ID - a.ID) }) {
			t.Errorf("%d rows, want 1000 in descending id order", len(rows))
		}
		if oldest := rows[len(rows)-1].CreatedAt; now.Sub(oldest) < 2*day {
			t.Errorf("the oldest row found was created %v ago: the search did not reach past one partition", now.Sub(oldest))
		}
	})

	// Row 4242: delivered, on the second day.
	for _, c := range []struct{ name, ref, index string }{
		{"ShowByKey", "key-4242", "forward_messages_key_idx"},
		{"ShowByID", "4242", "forward_messages_pkey"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := outboxdb.ExplainShow(ctx, pool, c.ref, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tables.checkPlan(t, plan, c.index)
			v, err := outboxdb.ShowRecord(ctx, pool, c.ref, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v.ID != 4242 || v.MessageKey != "key-4242" || v.Status != outboxdb.StatusSuccess ||
				v.AttemptsTotal != 1 || len(v.Attempts) != 1 || deref(v.ClaimedBy) != "fill" {
				t.Errorf("found row %d (%s, %s, %d attempts, delivered by %s), want 4242 (key-4242, SUCCESS, 1, fill)",
					v.ID, v.MessageKey, v.Status, v.AttemptsTotal, fixture.Str(v.ClaimedBy))
			}
		})
	}

	// What a held row waits behind is read through its key's order index.
	t.Run("ShowHolder", func(t *testing.T) {
		plan, err := outboxdb.ExplainHolder(ctx, pool, "P1050/B-010", 999500)
		if err != nil {
			t.Fatal(err)
		}
		tables.checkPlan(t, plan, "forward_deliveries_order_idx")
	})

	// The console's recent rates walk the primary keys of the newest
	// messages and attempts, not a partition whole.
	t.Run("ConsoleRates", func(t *testing.T) {
		plan, err := outboxdb.ExplainRates(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		tables.checkPlan(t, plan, "forward_messages_pkey")
		tables.checkPlan(t, plan, "forward_retry_logs_pkey")
		if _, err := outboxdb.ReadRates(ctx, pool); err != nil {
			t.Fatal(err)
		}
	})

	// The attempt logs of the rows shown or found are read in the
	// partitions of those rows only.
	t.Run("AttemptsInTheirPartition", func(t *testing.T) {
		rows, err := outboxdb.Find(ctx, pool, outboxdb.FindFilter{Plate: "粤B192398"}, outboxdb.LookupOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, len(rows))
		created := make([]time.Time, len(rows))
		want := map[string]bool{}
		for i, r := range rows {
			ids[i], created[i] = r.ID, r.CreatedAt
			want[tables.logsPartitionOf(t, r.CreatedAt)] = true
		}
		if len(want) < 3 {
			t.Fatalf("the plate's %d rows are in %d partitions, want several", len(rows), len(want))
		}
		attempts, errcodes, err := outboxdb.ExplainAnalyzeAttempts(ctx, pool, rows[0].ID, rows[0].CreatedAt, ids, created)
		if err != nil {
			t.Fatal(err)
		}
		read := scannedRelations(t, attempts)
		if logs := tables.logsPartitionOf(t, rows[0].CreatedAt); !slices.Equal(read, []string{logs}) {
			t.Errorf("the attempt log of row %d was read in %v, want only %s:\n%s", rows[0].ID, read, logs, attempts)
		}
		for _, rel := range scannedRelations(t, errcodes) {
			if !want[rel] {
				t.Errorf("the errcodes of the plate's rows read %s, which holds none of them:\n%s", rel, errcodes)
			}
		}
	})
}

// TestLookupPlansEmpty: on a new outbox, whose partitions are all empty and
// analysed as such, every search still returns (nothing) without error.
func TestLookupPlansEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []outboxdb.FindFilter{{}, {Plate: "x"}, {Errcode: "4"}, {Status: outboxdb.StatusFailed},
		{Since: time.Now().Add(-time.Hour)}} {
		rows, err := outboxdb.Find(ctx, pool, f, outboxdb.LookupOptions{})
		if err != nil || len(rows) != 0 {
			t.Errorf("Find(%v) = %d rows, %v; want none", f, len(rows), err)
		}
	}
}

// planTables is what the plan checks need to know about the partitions.
type planTables struct {
	// parentIndex maps a partition's index to the index of the partitioned
	// table it was made from.
	parentIndex map[string]string
	// partitions maps a partition (of messages or attempts) to its range.
	partitions map[string][2]time.Time
	// empty holds the partitions without a row, small those with fewer
	// than smallPartition.
	empty, small map[string]bool
}

func readPlanTables(t *testing.T, pool *pgxpool.Pool) planTables {
	t.Helper()
	ctx := context.Background()
	pt := planTables{parentIndex: map[string]string{}, partitions: map[string][2]time.Time{}, empty: map[string]bool{}, small: map[string]bool{}}
	rows, err := pool.Query(ctx, `SELECT c.relname::text, p.relname::text
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE c.relkind = 'i'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var child, parent string
		if err := rows.Scan(&child, &parent); err != nil {
			t.Fatal(err)
		}
		pt.parentIndex[child] = parent
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT lower, upper, messages, retry_logs FROM forward_partitions`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var lower, upper time.Time
		var messages, logs string
		if err := rows.Scan(&lower, &upper, &messages, &logs); err != nil {
			t.Fatal(err)
		}
		pt.partitions[messages] = [2]time.Time{lower, upper}
		pt.partitions[logs] = [2]time.Time{lower, upper}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for name := range pt.partitions {
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM %q LIMIT %d) s", name, smallPartition)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		pt.empty[name] = n == 0
		pt.small[name] = n < smallPartition
	}
	return pt
}

// logsPartitionOf names the attempt log partition of rows created at at.
func (pt planTables) logsPartitionOf(t *testing.T, at time.Time) string {
	t.Helper()
	for name, r := range pt.partitions {
		if strings.HasPrefix(name, "forward_retry_logs_") && !at.Before(r[0]) && at.Before(r[1]) {
			return name
		}
	}
	t.Fatalf("no partition holds %v", at)
	return ""
}

// smallPartition is the row count under which a partition may be read
// whole: today's partition just after midnight holds a few hundred rows,
// which PostgreSQL rightly reads faster whole than through an index.
const smallPartition = 10000

// checkPlan fails the test when an EXPLAIN (FORMAT JSON) plan scans a table
// of smallPartition rows or more sequentially (a smaller partition, such
// as an empty one, costs next to nothing to scan), or does not walk index
// (a partitioned index: its partitions' indexes count).
func (pt planTables) checkPlan(t *testing.T, planJSON, index string) {
	t.Helper()
	var used []string
	for _, n := range planNodes(t, planJSON) {
		if n.NodeType == "Seq Scan" && !pt.small[n.RelationName] {
			t.Errorf("the plan scans %s sequentially:\n%s", n.RelationName, planJSON)
		}
		if n.IndexName == "" {
			continue
		}
		name := n.IndexName
		if parent, ok := pt.parentIndex[name]; ok {
			name = parent
		}
		used = append(used, name)
	}
	if !slices.Contains(used, index) {
		t.Errorf("the plan does not use %s (it uses %s):\n%s", index, strings.Join(used, ", "), planJSON)
	}
}

// checkReadInRange fails the test when a search run under EXPLAIN
// (ANALYZE, FORMAT JSON) read a partition outside [since, until): pruned
// when planned (absent from the plan) or while running (never executed)
// is what a time filter promises.
func (pt planTables) checkReadInRange(t *testing.T, planJSON string, since, until time.Time) {
	t.Helper()
	for _, rel := range scannedRelations(t, planJSON) {
		if r, ok := pt.partitions[rel]; ok &&
			(!since.IsZero() && !r[1].After(since) || !until.IsZero() && !r[0].Before(until)) {
			t.Errorf("the search read %s, outside its time range:\n%s", rel, planJSON)
		}
	}
}

type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	IndexCond    string     `json:"Index Cond"`
	ActualLoops  *float64   `json:"Actual Loops"`
	ActualRows   float64    `json:"Actual Rows"`
	RowsRemoved  float64    `json:"Rows Removed by Filter"`
	Output       []string   `json:"Output"` // with VERBOSE
	Plans        []planNode `json:"Plans"`
}

// planNodes lists the nodes of an EXPLAIN (FORMAT JSON) plan.
func planNodes(t *testing.T, planJSON string) []planNode {
	t.Helper()
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(planJSON), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("reading the plan: %v\n%s", err, planJSON)
	}
	var nodes []planNode
	var walk func(n planNode)
	walk = func(n planNode) {
		nodes = append(nodes, n)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	return nodes
}

// scannedRelations lists the relations an EXPLAIN (ANALYZE, FORMAT JSON)
// plan read at least once (a partition pruned while the statement ran
// shows in the plan but never ran), sorted.
func scannedRelations(t *testing.T, planJSON string) []string {
	t.Helper()
	var rels []string
	for _, n := range planNodes(t, planJSON) {
		if n.RelationName != "" && n.ActualLoops != nil && *n.ActualLoops > 0 && !slices.Contains(rels, n.RelationName) {
			rels = append(rels, n.RelationName)
		}
	}
	slices.Sort(rels)
	return rels
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
