package outboxretry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

const day = 24 * time.Hour

// insertAged inserts one row with the given status, created age ago (in the
// partition of that day), and returns its id. A FAILED row is REJECTED: the
// input's compensation leaves it alone.
func (b *testBundle) insertAged(t testing.TB, status string, age time.Duration) int64 {
	t.Helper()
	r := fixture.Row{Key: fmt.Sprintf("aged-%d", b.keys.Add(1)), APIType: outboxdb.APITypeHeartbeat, Status: status, Age: age, Attempts: 1}
	if status == "FAILED" {
		r.FailureClass = "REJECTED"
	}
	return fixture.New(t, b.pool).Insert(r)[0]
}

func (b *testBundle) exists(t testing.TB, id int64) bool {
	t.Helper()
	return fixture.New(t, b.pool).Count("id = $1", id) == 1
}

func (b *testBundle) cleaner(olderThan time.Duration) *maintenance {
	return newMaintenance(day, &retentionConfig{OlderThan: olderThan, Interval: time.Hour}, b.pool, nil,
		service.MockResources().Logger())
}

// retiredMessages counts the messages of the partitions a run retired.
func retiredMessages(res retentionResult) int64 {
	_, msgs, _ := res.Retired()
	return msgs
}

func TestRetention(t *testing.T) {
	t.Parallel()
	const week = 7 * day

	t.Run("RunOnceRetiresOnlyFinishedOldPartitions", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var old []int64
		for range 5 {
			old = append(old, b.insertAged(t, "SUCCESS", 8*day))
		}
		// A FAILED row older than the retention goes with its day
		// (docs/architecture.md, "Retention").
		oldFailed := b.insertAged(t, "FAILED", 32*day)
		keep := map[string]int64{
			"recent SUCCESS":  b.insertAged(t, "SUCCESS", 6*day),
			"old PENDING":     b.insertAged(t, "PENDING", 30*day),
			"old IN_PROGRESS": b.insertAged(t, "IN_PROGRESS", 31*day),
			// Same day as the PENDING row: kept with it.
			"SUCCESS beside a PENDING row": b.insertAged(t, "SUCCESS", 30*day),
		}

		res, err := b.cleaner(week).runOnce(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, msgs, failed := res.Retired(); res.Skipped || msgs != 6 || failed != 1 {
			t.Fatalf("result %+v: %d messages retired, %d FAILED; want the 5 delivered and the 1 FAILED old row", res, msgs, failed)
		}
		for _, id := range append(old, oldFailed) {
			if b.exists(t, id) {
				t.Errorf("old finished row %d still there", id)
			}
		}
		for what, id := range keep {
			if !b.exists(t, id) {
				t.Errorf("%s row %d retired", what, id)
			}
		}
		var why []string
		for _, k := range res.Kept() {
			why = append(why, k.Why())
		}
		if strings.Join(why, "; ") != "1 PENDING row; 1 IN_PROGRESS row" && strings.Join(why, "; ") != "1 IN_PROGRESS row; 1 PENDING row" {
			t.Errorf("kept partitions %q, want the PENDING and IN_PROGRESS days", why)
		}

		res, err = b.cleaner(week).runOnce(b.ctx)
		if parts, _, _ := res.Retired(); err != nil || res.Skipped || parts != 0 || len(res.Kept()) != 2 {
			t.Fatalf("second run %+v, %v; want nothing left to retire and the 2 unfinished days kept", res, err)
		}
	})

	t.Run("OneOfTwoInstancesRetires", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 2 {
			b.insertAged(t, "SUCCESS", 8*day)
			b.insertAged(t, "SUCCESS", 9*day)
		}
		first, second := b.cleaner(week), b.cleaner(week)

		// The first instance stops after its first partition, holding the
		// lock, until the second has run.
		inside, resume := make(chan struct{}), make(chan struct{})
		calls := 0
		first.onProgress = func(outboxdb.PartitionOutcome) {
			if calls++; calls == 1 {
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
		if err != nil || !res.Skipped || retiredMessages(res) != 0 {
			t.Fatalf("second instance: %+v, %v; want it to skip while the first retires", res, err)
		}
		r := <-firstDone
		if r.err != nil || r.res.Skipped || retiredMessages(r.res) != 4 {
			t.Fatalf("first instance: %+v, %v; want the 4 rows of both days", r.res, r.err)
		}

		// The lock went with the first run: the next run of the second
		// instance takes it.
		b.insertAged(t, "SUCCESS", 10*day)
		res, err = second.runOnce(b.ctx)
		if err != nil || res.Skipped || retiredMessages(res) != 1 {
			t.Fatalf("second instance, next run: %+v, %v", res, err)
		}
	})

	t.Run("CancelledRunReleasesTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, age := range []time.Duration{8 * day, 9 * day, 10 * day} {
			b.insertAged(t, "SUCCESS", age)
		}
		ctx, cancel := context.WithCancel(b.ctx)
		c := b.cleaner(week)
		c.onProgress = func(outboxdb.PartitionOutcome) { cancel() }
		res, err := c.runOnce(ctx)
		if parts, _, _ := res.Retired(); !errors.Is(err, context.Canceled) || parts != 1 {
			t.Fatalf("cancelled run: %+v, %v; want one partition retired and context.Canceled", res, err)
		}
		res, err = b.cleaner(week).runOnce(b.ctx)
		if err != nil || res.Skipped {
			t.Fatalf("next run: %+v, %v; want the lock free", res, err)
		}
		if n := fixture.New(t, b.pool).Count("message_key LIKE 'aged-%'"); n != 0 {
			t.Errorf("%d old rows left after the second run", n)
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
			"retention: {older_than: 7d}": {OlderThan: week, Interval: time.Hour},
			// batch_size is accepted from older configs, and ignored.
			"retention: {older_than: 1d12h, interval: 15m, batch_size: 100}": {OlderThan: 36 * time.Hour, Interval: 15 * time.Minute},
			"retention: {older_than: 1d, interval: 1d, dead_letter: true}":   {OlderThan: day, Interval: day, DeadLetter: true},
			"retention: {older_than: 7m, force: true}":                       {OlderThan: 7 * time.Minute, Interval: time.Hour},
			"retention: {older_than: 0s, interval: 1d, force: true}":         {Interval: day},
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
		// The narrowest and widest partitions, and the default.
		for yaml, want := range map[string]time.Duration{
			"":                    day,
			"partition_width: 1h": time.Hour,
			"partition_width: 6h": 6 * time.Hour,
			"partition_width: 7d": week,
		} {
			if in, err := parse(yaml); err != nil || in.width != want {
				t.Errorf("%q: width %v, %v; want %v", yaml, in, err, want)
			}
		}
		for yaml, want := range map[string]string{
			"retention: {older_than: 7 days}":             "retention.older_than",
			"retention: {older_than: -7d}":                "retention.older_than",
			"retention: {older_than: 7d, interval: 0s}":   "retention.interval",
			"retention: {older_than: 7d, interval: soon}": "retention.interval",
			// Below a day without force: the message says why and how.
			"retention: {older_than: 7m}":                "retention.older_than: 7m is below the safe minimum of 1d",
			"retention: {older_than: 0s}":                "or retention.force: true to accept it",
			"retention: {older_than: 23h, force: false}": "retention.older_than: 23h is below the safe minimum",
			// Partition widths outside 1h..7d, or not whole hours: the
			// message names the field, its variable and what it accepts.
			"partition_width: 59m":   "field partition_width (OUTBOX_PARTITION in the shipped pipeline): 59m: a partition width must be a whole number of hours from 1h to 7d",
			"partition_width: 8d":    "partition_width (OUTBOX_PARTITION in the shipped pipeline): 8d: a partition width must be a whole number of hours from 1h to 7d",
			"partition_width: 90m":   "whole number of hours from 1h to 7d",
			"partition_width: 1 day": "partition_width",
		} {
			if _, err := parse(yaml); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: error %v, want one containing %q", yaml, err, want)
			}
		}
	})
}

// TestRetentionLoopStopsOnClose runs the upkeep inside a connected input:
// Connect makes the partitions ahead that are missing, the retention runs at
// start by itself, and Close stops it with every goroutine. Not parallel,
// so that only its own goroutines are counted.
func TestRetentionLoopStopsOnClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setup(t)
	old := b.insertAged(t, "SUCCESS", 8*day)
	pending := b.insertAged(t, "PENDING", 8*day+time.Minute)
	failed := b.insertAged(t, "FAILED", 9*day)

	// The partitions after the current hour are gone, as if no dispatcher
	// had run for days; the input runs with hourly partitions.
	db := fixture.New(t, b.pool)
	ps, err := outboxdb.ListPartitions(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	if err := b.pool.QueryRow(b.ctx, "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Upper.After(now) {
			db.Exec("DROP TABLE " + p.Messages + ", " + p.RetryLogs)
			db.Exec("DELETE FROM forward_partitions WHERE lower = $1", p.Lower)
		}
	}

	in := b.newInput(t, "partition_width: 1h\nretention:\n  older_than: 7d\n  interval: 1h\n")
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	ps, err = outboxdb.ListPartitions(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	var ahead []outboxdb.Partition
	for _, p := range ps {
		if p.Upper.After(now) {
			ahead = append(ahead, p)
		}
	}
	if len(ahead) != 1+outboxdb.PartitionsAhead || ahead[0].Lower.After(now) {
		t.Errorf("after Connect: partitions %+v from now on, want the current hour and %d ahead", ahead, outboxdb.PartitionsAhead)
	}
	for _, p := range ahead {
		if p.Upper.Sub(p.Lower) != time.Hour {
			t.Errorf("partition %s made by Connect, want an hour wide", p.Label())
		}
	}

	deadline := time.Now().Add(30 * time.Second)
	for b.exists(t, failed) {
		if time.Now().After(deadline) {
			t.Fatal("the retention did not retire the finished old day after Connect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !b.exists(t, pending) || !b.exists(t, old) {
		t.Fatal("the retention retired the day of a PENDING row")
	}
	if err := in.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.pool.Close()
}

// TestPartitionUpkeep: the running service keeps creating partitions
// ahead, not only when it connects. Partitions ahead that vanish (as when
// the clock moves on: the ones made at start are no longer ahead) are made
// again by the next run of the upkeep, a quarter of a width later (at most
// an hour).
func TestPartitionUpkeep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newMaintenance(time.Hour, nil, b.pool, nil, service.MockResources().Logger())
	if got := m.ensureInterval(); got != 15*time.Minute {
		t.Errorf("upkeep of hourly partitions every %s, want 15m", got)
	}
	if got := newMaintenance(7*day, nil, nil, nil, nil).ensureInterval(); got != time.Hour {
		t.Errorf("upkeep of weekly partitions every %s, want 1h", got)
	}
	m.ensureEvery = 50 * time.Millisecond
	m.start()
	defer m.close()

	var now time.Time
	if err := b.pool.QueryRow(b.ctx, "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	ahead := func() []outboxdb.Partition {
		ps, err := outboxdb.ListPartitions(b.ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		var out []outboxdb.Partition
		for _, p := range ps {
			if p.Upper.After(now) {
				out = append(out, p)
			}
		}
		return out
	}
	db := fixture.New(t, b.pool)
	for _, p := range ahead() {
		db.Exec("DROP TABLE " + p.Messages + ", " + p.RetryLogs)
		db.Exec("DELETE FROM forward_partitions WHERE lower = $1", p.Lower)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(ahead()) < 1+outboxdb.PartitionsAhead {
		if time.Now().After(deadline) {
			t.Fatalf("partitions from now on: %+v, want the current hour and %d ahead made again by the upkeep", ahead(), outboxdb.PartitionsAhead)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUpkeepWarnsOfManyPartitionsWithoutRetention: with retention off the
// partitions accumulate, and every insert probes each of them for its keys;
// past manyPartitions the upkeep says so, naming the setting. Not before,
// and not with retention on (it retires them).
func TestUpkeepWarnsOfManyPartitionsWithoutRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs logbuf.Buffer
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, nil)))
	warnings := func() []string {
		var out []string
		for _, line := range logs.Lines() {
			if strings.Contains(line, "level=WARN") {
				out = append(out, line)
			}
		}
		return out
	}
	off := newMaintenance(day, nil, b.pool, nil, log)
	off.warnIfMany(b.ctx)
	if w := warnings(); len(w) > 0 {
		t.Fatalf("warned with the partitions of a new database: %q", w)
	}

	fixture.New(t, b.pool).EnsurePartitions(manyPartitions * day)
	ps, err := outboxdb.ListPartitions(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) <= manyPartitions {
		t.Fatalf("%d partitions made, want more than %d", len(ps), manyPartitions)
	}
	newMaintenance(day, &retentionConfig{OlderThan: 7 * day, Interval: time.Hour}, b.pool, nil, log).warnIfMany(b.ctx)
	if w := warnings(); len(w) > 0 {
		t.Fatalf("warned with retention on: %q", w)
	}
	off.warnIfMany(b.ctx)
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("warnings with %d partitions and retention off: %q, want one", len(ps), w)
	}
	for _, want := range []string{fmt.Sprintf("%d partitions are kept", len(ps)), "from " + ps[0].Label(), "OUTBOX_RETENTION"} {
		if !strings.Contains(w[0], want) {
			t.Errorf("warning %q does not say %q", w[0], want)
		}
	}
}
