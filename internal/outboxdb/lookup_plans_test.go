package outboxdb_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// millionRows fills forward_records with 1 M rows spread over 30 days
// (newest last), in one statement, and gives the unfinished rows and a tenth
// of the delivered ones an attempt log:
//
//   - 80 % vehicle events with a plate (200 000 plates, about 4 rows each),
//     20 % heartbeats without one;
//   - 200 parks of 50 berths (berth codes repeat in every park), 2000
//     devices; park P0999 has only the 5000 oldest rows, like a park that
//     stopped sending a month ago: a search for it must not read the newer
//     995 000 rows first;
//   - 2 % FAILED (half REJECTED by errcode 998, half TRANSIENT after 999),
//     1 % PENDING plus the newest 1000 rows (a backlog), the rest SUCCESS;
//     every 50th delivered row with a log got errcode 4 (duplicate).
const millionRows = `
INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset,
    payload, status, attempt_count, next_retry_at, last_error, created_at, updated_at, succeeded_at,
    plate_no, park_code, berth_code, device_id, failure_class, failed_at)
SELECT 'key-' || g,
       CASE WHEN g % 5 = 0 THEN 'HEARTBEAT' ELSE 'VEHICLE_EVENT' END,
       'device-vehicle-event', g % 3, g, '\x7b7d'::bytea, s.status,
       CASE s.status WHEN 'SUCCESS' THEN 1 WHEN 'FAILED' THEN 5 ELSE 2 END,
       CASE WHEN s.status = 'PENDING' THEN t.at + interval '1 minute' END,
       CASE s.status WHEN 'FAILED' THEN CASE WHEN g % 2 = 0
           THEN 'not retried (rules[1] no_retry): http 200: {"errcode":"998"}'
           ELSE 'http 200: {"errcode":"999"}' END END,
       t.at, t.at, CASE WHEN s.status = 'SUCCESS' THEN t.at END,
       CASE WHEN g % 5 <> 0 THEN '粤B' || lpad((g::bigint * 7919 % 200000)::text, 6, '0') END,
       CASE WHEN g <= 5000 THEN 'P0999' ELSE 'P' || (1000 + g % 200) END,
       'B-' || lpad(((g / 200) % 50)::text, 3, '0'),
       'CAM-' || lpad((g % 2000)::text, 4, '0'),
       CASE s.status WHEN 'FAILED' THEN CASE WHEN g % 2 = 0 THEN 'REJECTED' ELSE 'TRANSIENT' END END,
       CASE s.status WHEN 'FAILED' THEN t.at END
FROM generate_series(1, 1000000) AS g,
     LATERAL (SELECT now() - (1000000 - g) * interval '2.6 second' AS at) t,
     LATERAL (SELECT CASE WHEN g > 999000 OR g % 100 = 2 THEN 'PENDING'
                          WHEN g % 100 < 2 THEN 'FAILED'
                          ELSE 'SUCCESS' END AS status) s`

const millionLogs = `
INSERT INTO forward_retry_logs (record_id, attempt_number, result_status, platform_errcode, attempted_at)
SELECT r.id, 1, CASE r.status WHEN 'FAILED' THEN 'FAILED' WHEN 'SUCCESS' THEN 'SUCCESS' ELSE 'PENDING' END,
       CASE WHEN r.failure_class = 'REJECTED' THEN '998'
            WHEN r.status IN ('FAILED', 'PENDING') THEN '999'
            WHEN r.id % 50 = 0 THEN '4' END,
       r.created_at
FROM forward_records r
WHERE r.status <> 'SUCCESS' OR r.id % 10 = 0`

// TestLookupPlans: every search `outbox find` and the console can run, and
// `outbox show` by key and by id, reach their rows through an index on a
// table of 1 M rows: no sequential scan of forward_records (or of the
// attempt log), and the index each search is meant to walk is the one in
// the plan. One database is shared by the subtests; it takes most of the
// test's time to fill.
func TestLookupPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	start := time.Now()
	// One connection: the temporary table and the setting live in its session.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Filled the quick way, which takes a third less time than inserting
	// into the indexed tables: unlogged (both tables are empty, so that is
	// instant; the rows are not written to the WAL too), and with the
	// secondary indexes of forward_records dropped first and built again
	// afterwards from their own definitions (pg_get_indexdef), so the schema
	// under test is exactly the migrated one. Plans depend on neither.
	for _, sql := range []string{
		"ALTER TABLE forward_retry_logs SET UNLOGGED",
		"ALTER TABLE forward_records SET UNLOGGED",
		"SET maintenance_work_mem = '128MB'",
		`CREATE TEMP TABLE lookup_indexes AS
		   SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS def
		   FROM pg_index WHERE indrelid = 'forward_records'::regclass AND NOT indisprimary AND NOT indisunique`,
		`DO $$ DECLARE i record; BEGIN
		   FOR i IN SELECT name FROM lookup_indexes LOOP EXECUTE 'DROP INDEX ' || i.name; END LOOP; END $$`,
		millionRows, millionLogs,
		`DO $$ DECLARE i record; BEGIN
		   FOR i IN SELECT def FROM lookup_indexes LOOP EXECUTE i.def; END LOOP; END $$`,
		"ANALYZE forward_records", "ANALYZE forward_retry_logs",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("filling the table: %v", err)
		}
	}
	conn.Release()
	t.Logf("1 M rows written and analysed in %v", time.Since(start).Round(time.Millisecond))

	now := time.Now()
	for _, c := range []struct {
		name   string
		filter outboxdb.FindFilter
		// index is the index the search must walk.
		index string
		// check, when set, checks each row found.
		check func(outboxdb.FoundRow) bool
	}{
		// Rows 4242, 204242, ... 804242 (7919 × g mod 200000 = 192398).
		{"Plate", outboxdb.FindFilter{Plate: "粤B192398"}, "forward_records_plate_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.PlateNo) == "粤B192398" }},
		{"Park", outboxdb.FindFilter{Park: "P1050"}, "forward_records_park_id_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P1050" }},
		{"ParkWithOnlyOldRows", outboxdb.FindFilter{Park: "P0999"}, "forward_records_park_id_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P0999" }},
		{"ParkAndBerth", outboxdb.FindFilter{Park: "P1050", Berth: "B-010"}, "forward_records_park_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.ParkCode) == "P1050" && deref(r.BerthCode) == "B-010" }},
		{"Berth", outboxdb.FindFilter{Berth: "B-010"}, "forward_records_berth_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.BerthCode) == "B-010" }},
		{"Device", outboxdb.FindFilter{Device: "CAM-0042"}, "forward_records_device_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.DeviceID) == "CAM-0042" }},
		{"StatusFailed", outboxdb.FindFilter{Status: outboxdb.StatusFailed}, "forward_records_unfinished_status_idx",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusFailed }},
		{"StatusPending", outboxdb.FindFilter{Status: outboxdb.StatusPending}, "forward_records_unfinished_status_idx",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusPending }},
		{"StatusSuccess", outboxdb.FindFilter{Status: outboxdb.StatusSuccess}, "forward_records_pkey",
			func(r outboxdb.FoundRow) bool { return r.Status == outboxdb.StatusSuccess }},
		{"Errcode", outboxdb.FindFilter{Errcode: "998"}, "forward_retry_logs_errcode_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.LastErrcode) == "998" }},
		{"ErrcodeDuplicate", outboxdb.FindFilter{Errcode: "4"}, "forward_retry_logs_errcode_idx",
			func(r outboxdb.FoundRow) bool {
				return deref(r.LastErrcode) == "4" && r.Status == outboxdb.StatusSuccess
			}},
		{"Since", outboxdb.FindFilter{Since: now.Add(-24 * time.Hour)}, "forward_records_created_at_idx",
			func(r outboxdb.FoundRow) bool { return !r.CreatedAt.Before(now.Add(-24 * time.Hour)) }},
		{"Until", outboxdb.FindFilter{Until: now.Add(-20 * 24 * time.Hour)}, "forward_records_created_at_idx",
			func(r outboxdb.FoundRow) bool { return r.CreatedAt.Before(now.Add(-20 * 24 * time.Hour)) }},
		{"SinceAndUntil", outboxdb.FindFilter{Since: now.Add(-10 * 24 * time.Hour), Until: now.Add(-9 * 24 * time.Hour)},
			"forward_records_created_at_idx", nil},
		{"StatusFailedSince", outboxdb.FindFilter{Status: outboxdb.StatusFailed, Since: now.Add(-time.Hour)},
			"forward_records_unfinished_status_idx", nil},
		{"PlateStatusAndSince", outboxdb.FindFilter{Plate: "粤B192398", Status: outboxdb.StatusSuccess, Since: now.Add(-30 * 24 * time.Hour)},
			"forward_records_plate_idx", nil},
		{"DeviceAndErrcode", outboxdb.FindFilter{Device: "CAM-0002", Errcode: "999"}, "forward_records_device_idx",
			func(r outboxdb.FoundRow) bool { return deref(r.LastErrcode) == "999" }},
		{"Nothing", outboxdb.FindFilter{}, "forward_records_pkey", nil},
		{"UnknownPlate", outboxdb.FindFilter{Plate: "no such plate"}, "forward_records_plate_idx", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := outboxdb.ExplainFind(ctx, pool, c.filter, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, plan, c.index)

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

	// Newest first, within one search.
	t.Run("NewestFirst", func(t *testing.T) {
		rows, err := outboxdb.Find(ctx, pool, outboxdb.FindFilter{Park: "P1050", Limit: 200}, outboxdb.LookupOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 200 || !slices.IsSortedFunc(rows, func(a, b outboxdb.FoundRow) int { return int(b.ID - a.ID) }) {
			t.Errorf("%d rows, want 200 in descending id order", len(rows))
		}
	})

	for _, c := range []struct{ name, ref, index string }{
		{"ShowByKey", "key-4242", "forward_records_message_key_key"},
		{"ShowByID", "4242", "forward_records_pkey"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := outboxdb.ExplainShow(ctx, pool, c.ref, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, plan, c.index)
			v, err := outboxdb.ShowRecord(ctx, pool, c.ref, outboxdb.LookupOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v.ID != 4242 || v.MessageKey != "key-4242" {
				t.Errorf("found row %d (%s), want 4242 (key-4242)", v.ID, v.MessageKey)
			}
		})
	}
}

// checkPlan fails the test when an EXPLAIN (FORMAT JSON) plan scans
// forward_records or forward_retry_logs sequentially, or does not use index.
func checkPlan(t *testing.T, planJSON, index string) {
	t.Helper()
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(planJSON), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("reading the plan: %v\n%s", err, planJSON)
	}
	var seq, indexes []string
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.NodeType == "Seq Scan" {
			seq = append(seq, n.RelationName)
		}
		if n.IndexName != "" {
			indexes = append(indexes, n.IndexName)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	for _, rel := range seq {
		if rel == "forward_records" || rel == "forward_retry_logs" {
			t.Errorf("the plan scans %s sequentially:\n%s", rel, planJSON)
		}
	}
	if !slices.Contains(indexes, index) {
		t.Errorf("the plan does not use %s (it uses %s):\n%s", index, strings.Join(indexes, ", "), planJSON)
	}
}

type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
