package outboxdb_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func pendingRec(key string, offset int64) outboxdb.NewRecord {
	return outboxdb.NewRecord{
		MessageKey:     key,
		APIType:        outboxdb.APITypeVehicleEvent,
		KafkaTopic:     "device-vehicle-event",
		KafkaPartition: 2,
		KafkaOffset:    offset,
		KafkaKey:       []byte("CAM-0001"),
		Payload:        []byte(`{"messageId":"` + key + `"}`),
		Status:         outboxdb.StatusPending,
	}
}

type storedRow struct {
	ID             int64
	MessageKey     string
	APIType        string
	KafkaTopic     string
	KafkaPartition int32
	KafkaOffset    int64
	KafkaKey       []byte
	Payload        []byte
	Status         string
	AttemptCount   int
	NextRetryAt    *time.Time
	LastError      *string
	UpdatedAt      time.Time
}

func readRows(t *testing.T, pool *pgxpool.Pool) map[string]storedRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, message_key, api_type, kafka_topic,
		kafka_partition, kafka_offset, kafka_key, payload, status, attempt_count, next_retry_at,
		last_error, updated_at FROM forward_records`)
	if err != nil {
		t.Fatal(err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[storedRow])
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]storedRow, len(list))
	for _, r := range list {
		out[r.MessageKey] = r
	}
	return out
}

func TestInsertBatchCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("StoresEveryColumnByteForByte", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		bad := []byte{0xff, 0xfe, 'x', 0x00, 0xc3}
		recs := []outboxdb.NewRecord{
			pendingRec("k1", 10),
			{
				MessageKey: "device-heartbeat-0-11", APIType: "UNKNOWN",
				KafkaTopic: "device-heartbeat", KafkaPartition: 0, KafkaOffset: 11,
				KafkaKey: nil, Payload: bad,
				Status: outboxdb.StatusFailed, LastError: "payload is not valid UTF-8",
			},
			{
				MessageKey: "device-heartbeat-0-12", APIType: outboxdb.APITypeHeartbeat,
				KafkaTopic: "device-heartbeat", KafkaPartition: 0, KafkaOffset: 12,
				KafkaKey: []byte{}, Payload: nil,
				Status: outboxdb.StatusFailed, LastError: "payload is empty",
			},
		}
		c, err := outboxdb.InsertBatchCount(ctx, pool, recs)
		if err != nil {
			t.Fatal(err)
		}
		if c != (outboxdb.InsertCounts{Pending: 1, Failed: 2}) {
			t.Errorf("inserted %+v, want 1 pending and 2 failed", c)
		}
		got := readRows(t, pool)
		if len(got) != 3 {
			t.Fatalf("%d rows, want 3", len(got))
		}
		k1 := got["k1"]
		if k1.ID == 0 || k1.APIType != outboxdb.APITypeVehicleEvent || k1.KafkaTopic != "device-vehicle-event" ||
			k1.KafkaPartition != 2 || k1.KafkaOffset != 10 || string(k1.KafkaKey) != "CAM-0001" ||
			string(k1.Payload) != `{"messageId":"k1"}` || k1.Status != "PENDING" || k1.AttemptCount != 0 ||
			k1.NextRetryAt == nil || k1.LastError != nil {
			t.Errorf("pending row = %+v", k1)
		}
		f := got["device-heartbeat-0-11"]
		if !bytes.Equal(f.Payload, bad) || f.KafkaKey != nil || f.Status != "FAILED" || f.NextRetryAt != nil ||
			f.LastError == nil || *f.LastError != "payload is not valid UTF-8" || f.APIType != "UNKNOWN" {
			t.Errorf("failed row = %+v", f)
		}
		e := got["device-heartbeat-0-12"]
		if e.Payload == nil || len(e.Payload) != 0 || e.KafkaKey == nil || len(e.KafkaKey) != 0 {
			t.Errorf("empty payload/key row: payload %v key %v, want both empty, not NULL", e.Payload, e.KafkaKey)
		}
	})

	t.Run("DuplicateKeysInOneBatchFirstWins", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		a, b, c := pendingRec("dup", 1), pendingRec("other", 2), pendingRec("dup", 3)
		c.Payload = []byte(`{"messageId":"dup","second":true}`)
		n, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{a, b, c})
		if err != nil {
			t.Fatal(err)
		}
		if n.Pending != 2 {
			t.Fatalf("inserted %+v: want the first dup and other only", n)
		}
		got := readRows(t, pool)
		if len(got) != 2 || got["dup"].KafkaOffset != 1 {
			t.Fatalf("rows %+v: want 2 rows, dup from offset 1", got)
		}
	})

	t.Run("ExistingRowsAreLeftAlone", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("done", 1), pendingRec("bad", 2), pendingRec("wait", 3)}); err != nil {
			t.Fatal(err)
		}
		// done was delivered (its delivery row gone, its attempt logged);
		// bad FAILED.
		if _, err := pool.Exec(ctx, `WITH d AS (DELETE FROM forward_deliveries WHERE message_key = 'done' RETURNING id, created_at)
			INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status)
			SELECT id, created_at, 1, 'SUCCESS', 200 FROM d`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL, last_error = 'x', attempt_count = 5 WHERE message_key = 'bad'`); err != nil {
			t.Fatal(err)
		}
		before := readRows(t, pool)

		again := []outboxdb.NewRecord{pendingRec("done", 7), pendingRec("bad", 8), pendingRec("wait", 9), pendingRec("new", 10)}
		for i := range 3 {
			again[i].Payload = []byte(`{"changed":true}`)
		}
		c, err := outboxdb.InsertBatchCount(ctx, pool, again)
		if err != nil {
			t.Fatal(err)
		}
		if c != (outboxdb.InsertCounts{Pending: 1, Existing: 3}) {
			t.Errorf("inserted %+v, want only the new key, and the 3 others counted existing", c)
		}
		after := readRows(t, pool)
		if _, ok := after["new"]; !ok {
			t.Errorf("new key not inserted")
		}
		for _, k := range []string{"done", "bad", "wait"} {
			b, a := before[k], after[k]
			if a.ID != b.ID || a.Status != b.Status || a.AttemptCount != b.AttemptCount || !bytes.Equal(a.Payload, b.Payload) ||
				a.KafkaOffset != b.KafkaOffset || !a.UpdatedAt.Equal(b.UpdatedAt) {
				t.Errorf("row %s changed: %+v -> %+v", k, b, a)
			}
		}
	})

	t.Run("NotifiesOnlyWhenAPendingRowIsInserted", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		listener := pgtest.Listen(t, pool, outboxdb.NotifyChannel)

		failed := pendingRec("f", 1)
		failed.Status, failed.LastError = outboxdb.StatusFailed, "payload is empty"
		steps := [][]outboxdb.NewRecord{
			{failed},                                 // no PENDING row: no notification
			{pendingRec("p", 2)},                     // one notification
			{pendingRec("p", 3)},                     // duplicate only: none
			{pendingRec("q", 4), pendingRec("r", 5)}, // one for the statement
		}
		for _, s := range steps {
			if _, err := outboxdb.InsertBatchCount(ctx, pool, s); err != nil {
				t.Fatal(err)
			}
		}
		// Notifications arrive in commit order; the sentinel marks the end.
		if _, err := pool.Exec(ctx, "SELECT pg_notify($1, 'end')", outboxdb.NotifyChannel); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var got int
		for {
			n, err := listener.WaitForNotification(wctx)
			if err != nil {
				t.Fatalf("waiting for notifications: %v", err)
			}
			if n.Payload == "end" {
				break
			}
			got++
		}
		if got != 2 {
			t.Fatalf("%d notifications before the sentinel, want 2 (one per batch that inserted a PENDING row)", got)
		}
	})

	t.Run("ConcurrentOverlappingBatchesMakeOneRowPerKey", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		const keys, workers, rounds = 200, 4, 5
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for range rounds {
					perm := rng.Perm(keys)[:keys/2]
					recs := make([]outboxdb.NewRecord, len(perm))
					for j, k := range perm {
						recs[j] = pendingRec(fmt.Sprintf("key-%03d", k), int64(k))
					}
					if _, err := outboxdb.InsertBatchCount(ctx, pool, recs); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		var rows, distinct int
		if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT message_key) FROM forward_records").Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		if rows != distinct {
			t.Fatalf("%d rows for %d keys", rows, distinct)
		}
	})

	t.Run("CountsNewRowsOnly", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		failed := pendingRec("f", 3)
		failed.Status, failed.LastError = outboxdb.StatusFailed, "payload is empty"
		c, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("a", 1), pendingRec("b", 2), failed, pendingRec("a", 4)})
		if err != nil {
			t.Fatal(err)
		}
		if c != (outboxdb.InsertCounts{Pending: 2, Failed: 1, Existing: 1}) {
			t.Fatalf("counts %+v, want 2 pending 1 failed, and the second a existing", c)
		}
		c, err = outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("b", 5), pendingRec("c", 6)})
		if err != nil {
			t.Fatal(err)
		}
		if c != (outboxdb.InsertCounts{Pending: 1, Existing: 1}) {
			t.Fatalf("counts %+v, want only c, and b existing", c)
		}
		rows := readRows(t, pool)
		if len(rows) != 4 || rows["a"].KafkaOffset != 1 || rows["b"].KafkaOffset != 2 || rows["f"].NextRetryAt != nil {
			t.Fatalf("rows %+v", rows)
		}
	})

	t.Run("RejectsKeysAndStatusesTheTableCannotHold", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		for name, mut := range map[string]func(*outboxdb.NewRecord){
			"empty key":  func(r *outboxdb.NewRecord) { r.MessageKey = "" },
			"NUL":        func(r *outboxdb.NewRecord) { r.MessageKey = "a\x00b" },
			"not UTF-8":  func(r *outboxdb.NewRecord) { r.MessageKey = "a\xffb" },
			"too long":   func(r *outboxdb.NewRecord) { r.MessageKey = strings.Repeat("k", outboxdb.MaxKeyBytes+1) },
			"bad status": func(r *outboxdb.NewRecord) { r.Status = outboxdb.StatusSuccess },
		} {
			rec := pendingRec("k", 1)
			mut(&rec)
			if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{rec}); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
		if n := len(readRows(t, pool)); n != 0 {
			t.Fatalf("%d rows written by rejected batches", n)
		}
	})
}

// TestInsertBackstopReadsTheKeyIndex: the insert's backstop reads each key
// of the batch from the message-key index of the last day's partitions
// whatever the statistics say. On a day's partition autovacuum had not
// analysed yet, the generic plan of the statement as one `= ANY` scan was
// a BitmapAnd with the primary key index, reading every entry of the
// partition on each insert (5 ms at 70 000 rows, and growing through the
// day); the latency benchmark at 2 000 msgs/s fell behind with it.
func TestInsertBackstopReadsTheKeyIndex(t *testing.T) {
	t.Parallel()
	b := setupClaimTest(t)
	// A day's partition filling before autovacuum has analysed it.
	parts, err := outboxdb.ListPartitions(b.Ctx, b.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		b.Exec(`ALTER TABLE ` + pgx.Identifier{p.Messages}.Sanitize() + ` SET (autovacuum_enabled = false)`)
	}
	b.Exec(`INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
		SELECT 'stored-' || g, 'VEHICLE_EVENT', 't', 0, g, convert_to(repeat('x', 600), 'UTF8') FROM generate_series(1, 70000) g`)
	var today string
	if err := b.Pool.QueryRow(b.Ctx, `SELECT tableoid::regclass::text FROM forward_messages LIMIT 1`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	conn, err := b.Pool.Acquire(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The plan a prepared statement settles on after five runs (EXPLAIN
	// of the statement itself would plan it for its parameters' values).
	if _, err := conn.Exec(b.Ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `RESET plan_cache_mode; DEALLOCATE backstop`) }()
	if _, err := conn.Exec(b.Ctx, `PREPARE backstop(text[]) AS `+outboxdb.StatementSQL("insert_backstop.sql")); err != nil {
		t.Fatal(err)
	}
	keys := []string{"stored-1", "stored-2", "new-1"}
	plan := explainPlan(t, conn, `EXECUTE backstop('{stored-1,stored-2,new-1}')`)
	var probes int
	var walk func(n explainNode)
	walk = func(n explainNode) {
		switch {
		case n.RelationName == today && n.NodeType == "Seq Scan":
			t.Errorf("reads the day's partition %s whole (Seq Scan)", n.RelationName)
		case strings.HasSuffix(n.IndexName, "_pkey"):
			t.Errorf("reads the primary key index %s (%s): every entry of the partition", n.IndexName, n.IndexCond)
		case strings.HasSuffix(n.IndexName, "_message_key_idx"):
			probes++
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan)
	if probes == 0 {
		t.Errorf("no probe of a message-key index")
	}
	if t.Failed() {
		t.Logf("plan:\n%s", plan)
	}
	// And it still refuses a key stored twice.
	b.Exec(`INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
		VALUES ('stored-2', 'VEHICLE_EVENT', 't', 0, 1, '\x7b7d')`)
	var n int
	err = conn.QueryRow(b.Ctx, outboxdb.StatementSQL("insert_backstop.sql"), keys).Scan(&n)
	if !strings.Contains(fmt.Sprint(err), "message key stored-2 was stored by another transaction") {
		t.Fatalf("backstop over a key stored twice: %v (count %d), want a serialization failure naming it", err, n)
	}
}

// TestKeyConflicts: records a batch skips because their key is stored are
// counted, and KeyConflicts names those among them whose payload differs
// from the stored one: not a redelivery (the same bytes, an absent payload
// again absent) but another message under the key, in an earlier batch or
// earlier in the same one.
func TestKeyConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	empty := outboxdb.NewRecord{MessageKey: "device-heartbeat-0-12", APIType: outboxdb.APITypeHeartbeat,
		KafkaTopic: "device-heartbeat", KafkaOffset: 12, Status: outboxdb.StatusFailed, LastError: "payload is empty"}
	if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{pendingRec("k1", 1), pendingRec("k2", 2), empty}); err != nil {
		t.Fatal(err)
	}
	other := func(r outboxdb.NewRecord) outboxdb.NewRecord {
		r.Payload = append(r.Payload[:len(r.Payload):len(r.Payload)], ' ')
		return r
	}
	batch := []outboxdb.NewRecord{
		pendingRec("k1", 1),        // redelivered
		other(pendingRec("k2", 3)), // k2 reused
		pendingRec("k3", 4),        // new
		other(pendingRec("k3", 5)), // k3 reused within the batch
		empty,                      // redelivered, still without payload
	}
	c, err := outboxdb.InsertBatchCount(ctx, pool, batch)
	if err != nil {
		t.Fatal(err)
	}
	if c != (outboxdb.InsertCounts{Pending: 1, Existing: 4}) {
		t.Fatalf("counts %+v, want 1 pending and 4 existing", c)
	}
	idx, err := outboxdb.KeyConflicts(ctx, pool, batch)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(idx) != "[1 3]" {
		t.Fatalf("conflicts at %v, want [1 3]: k2 and the second k3", idx)
	}
}
