package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// insertAged inserts one row with the given status, delivered (SUCCESS) or
// created age ago, with logs attempt-log rows, and returns its id.
func (b *testBundle) insertAged(t testing.TB, status string, age time.Duration, logs int) int64 {
	t.Helper()
	key := b.keys.Add(1)
	var id int64
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO forward_records
		(message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, status, attempt_count,
		 next_retry_at, created_at, updated_at, succeeded_at, last_error)
		SELECT 'aged-' || $1::bigint, 'HEARTBEAT', 'device-heartbeat', 0, $1::bigint, '\x7b7d', $2::text, $4::integer,
		       CASE WHEN $2::text IN ('PENDING', 'IN_PROGRESS') THEN now() END,
		       ts, ts,
		       CASE WHEN $2::text = 'SUCCESS' THEN ts END,
		       CASE WHEN $2::text = 'FAILED' THEN 'errcode 998' END
		FROM (SELECT now() - $3::bigint * interval '1 millisecond' AS ts) t
		RETURNING id`, key, status, age.Milliseconds(), logs).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO forward_retry_logs (record_id, attempt_number, result_status)
		SELECT $1, g, 'PENDING' FROM generate_series(1, $2::integer) g`, id, logs); err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *testBundle) exists(t testing.TB, id int64) bool {
	t.Helper()
	return b.count(t, "id = $1", id) == 1
}

func (b *testBundle) logCount(t testing.TB, id int64) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM forward_retry_logs WHERE record_id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *testBundle) cleaner(olderThan time.Duration, batch int) *retention {
	return newRetention(retentionConfig{OlderThan: olderThan, Interval: time.Hour, BatchSize: batch}, b.pool, nil, service.MockResources().Logger())
}

func TestRetention(t *testing.T) {
	t.Parallel()
	const week = 7 * 24 * time.Hour

	t.Run("RunOnceDeletesOnlyOldDeliveredRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var old []int64
		for range 5 {
			old = append(old, b.insertAged(t, "SUCCESS", 8*24*time.Hour, 2))
		}
		keep := map[string]int64{
			"recent SUCCESS":  b.insertAged(t, "SUCCESS", 6*24*time.Hour, 1),
			"old PENDING":     b.insertAged(t, "PENDING", 30*24*time.Hour, 1),
			"old IN_PROGRESS": b.insertAged(t, "IN_PROGRESS", 30*24*time.Hour, 1),
			"old FAILED":      b.insertAged(t, "FAILED", 30*24*time.Hour, 3),
		}

		// A batch size of 2 makes the 5 rows take three transactions.
		res, err := b.cleaner(week, 2).runOnce(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped || res.Records != 5 || res.Logs != 10 || res.Batches != 3 {
			t.Fatalf("result %+v, want 5 rows and 10 logs in 3 batches", res)
		}
		for _, id := range old {
			if b.exists(t, id) || b.logCount(t, id) != 0 {
				t.Errorf("old SUCCESS row %d or its logs still there", id)
			}
		}
		for what, id := range keep {
			if !b.exists(t, id) || b.logCount(t, id) == 0 {
				t.Errorf("%s row %d or its logs deleted", what, id)
			}
		}

		res, err = b.cleaner(week, 2).runOnce(b.ctx)
		if err != nil || res.Skipped || res.Records != 0 {
			t.Fatalf("second run %+v, %v; want nothing left to delete", res, err)
		}
	})

	t.Run("OneOfTwoInstancesPurges", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 4 {
			b.insertAged(t, "SUCCESS", 8*24*time.Hour, 1)
		}
		first, second := b.cleaner(week, 1), b.cleaner(week, 1)

		// The first instance stops after its first batch, holding the lock,
		// until the second has run.
		inside, resume := make(chan struct{}), make(chan struct{})
		first.onProgress = func(p outboxdb.PurgeResult) {
			if p.Batches == 1 {
				close(inside)
				<-resume
			}
		}
		type outcome struct {
			res retentionResult
			err error
		}
		firstDone := make(chan outcome, 1)
		go func() {
			res, err := first.runOnce(b.ctx)
			firstDone <- outcome{res, err}
		}()
		select {
		case <-inside:
		case r := <-firstDone:
			t.Fatalf("first instance finished without pausing: %+v, %v", r.res, r.err)
		}

		res, err := second.runOnce(b.ctx)
		close(resume)
		if err != nil || !res.Skipped || res.Records != 0 {
			t.Fatalf("second instance: %+v, %v; want it to skip while the first purges", res, err)
		}
		r := <-firstDone
		if r.err != nil || r.res.Skipped || r.res.Records != 4 {
			t.Fatalf("first instance: %+v, %v; want all 4 rows", r.res, r.err)
		}

		// The lock went with the first run: the next run of the second
		// instance takes it.
		b.insertAged(t, "SUCCESS", 8*24*time.Hour, 0)
		res, err = second.runOnce(b.ctx)
		if err != nil || res.Skipped || res.Records != 1 {
			t.Fatalf("second instance, next run: %+v, %v", res, err)
		}
	})

	t.Run("CancelledRunReleasesTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 3 {
			b.insertAged(t, "SUCCESS", 8*24*time.Hour, 0)
		}
		ctx, cancel := context.WithCancel(b.ctx)
		c := b.cleaner(week, 1)
		c.onProgress = func(outboxdb.PurgeResult) { cancel() }
		res, err := c.runOnce(ctx)
		if !errors.Is(err, context.Canceled) || res.Records != 1 {
			t.Fatalf("cancelled run: %+v, %v; want one batch and context.Canceled", res, err)
		}
		res, err = b.cleaner(week, 1).runOnce(b.ctx)
		if err != nil || res.Skipped || res.Records != 2 {
			t.Fatalf("next run: %+v, %v; want the lock free and the 2 rows left deleted", res, err)
		}
	})

	t.Run("Config", func(t *testing.T) {
		t.Parallel()
		parse := func(yaml string) (*outboxRetry, error) {
			conf, err := outboxRetrySpec().ParseYAML("dsn: postgres://localhost/db\n"+yaml, nil)
			if err != nil {
				return nil, err
			}
			return newOutboxRetryFromParsed(conf, service.MockResources())
		}
		for yaml, want := range map[string]*retentionConfig{
			"":                            nil,
			"retention: {}":               nil,
			"retention: {older_than: ''}": nil,
			"retention: {older_than: 7d}": {OlderThan: week, Interval: time.Hour, BatchSize: 5000},
			"retention: {older_than: 1d12h, interval: 15m, batch_size: 100}": {OlderThan: 36 * time.Hour, Interval: 15 * time.Minute, BatchSize: 100},
			"retention: {older_than: 1d, interval: 1d}":                      {OlderThan: 24 * time.Hour, Interval: 24 * time.Hour, BatchSize: 5000},
			"retention: {older_than: 7m, force: true}":                       {OlderThan: 7 * time.Minute, Interval: time.Hour, BatchSize: 5000},
			"retention: {older_than: 0s, interval: 1d, force: true}":         {Interval: 24 * time.Hour, BatchSize: 5000},
		} {
			in, err := parse(yaml)
			if err != nil {
				t.Errorf("%q: %v", yaml, err)
				continue
			}
			if (in.retention == nil) != (want == nil) || (want != nil && *in.retention != *want) {
				t.Errorf("%q: retention %+v, want %+v", yaml, in.retention, want)
			}
		}
		for yaml, want := range map[string]string{
			"retention: {older_than: 7 days}":             "retention.older_than",
			"retention: {older_than: -7d}":                "retention.older_than",
			"retention: {older_than: 7d, interval: 0s}":   "retention.interval",
			"retention: {older_than: 7d, interval: soon}": "retention.interval",
			"retention: {older_than: 7d, batch_size: 0}":  "retention.batch_size",
			// Below a day without force: the message says why and how.
			"retention: {older_than: 7m}":                "retention.older_than: 7m is below the safe minimum of 1d",
			"retention: {older_than: 0s}":                "or retention.force: true to accept it",
			"retention: {older_than: 23h, force: false}": "retention.older_than: 23h is below the safe minimum",
		} {
			if _, err := parse(yaml); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: error %v, want one naming %s", yaml, err, want)
			}
		}
	})
}

// TestRetentionLoopStopsOnClose runs the cleaner inside a connected input:
// it purges at start by itself, and Close stops it with every goroutine. Not
// parallel, so that only its own goroutines are counted.
func TestRetentionLoopStopsOnClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setup(t)
	old := b.insertAged(t, "SUCCESS", 8*24*time.Hour, 1)
	failed := b.insertAged(t, "FAILED", 8*24*time.Hour, 1)

	in := b.newInput(t, "retention:\n  older_than: 7d\n  interval: 1h\n")
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b.exists(t, old) {
		if time.Now().After(deadline) {
			t.Fatal("the cleaner did not purge the delivered row after Connect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !b.exists(t, failed) {
		t.Fatal("the cleaner deleted a FAILED row")
	}
	if err := in.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.pool.Close()
}
