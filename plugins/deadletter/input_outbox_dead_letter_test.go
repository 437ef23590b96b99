package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	ctx  context.Context
	dsn  string
	pool *pgxpool.Pool
	keys atomic.Int64
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	return &testBundle{ctx: context.Background(), dsn: dsn, pool: pool}
}

// input builds and connects an outbox_dead_letter input, closed at the end
// of the test; extra is YAML added to the config.
func (b *testBundle) input(t testing.TB, extra string) *deadLetter {
	t.Helper()
	conf, err := deadLetterSpec().ParseYAML(fmt.Sprintf("dsn: %q\n%s", b.dsn, extra), nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := newDeadLetterFromParsed(conf, service.MockResources())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(context.Background()) })
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	return in
}

// insert adds a row with the given status and returns its id. FAILED rows
// get a reason and an HTTP status (NULL when httpStatus is 0).
func (b *testBundle) insert(t testing.TB, status string, httpStatus int) int64 {
	t.Helper()
	n := b.keys.Add(1)
	due := time.Duration(0)
	return fixture.New(t, b.pool).Insert(fixture.Row{
		Key: fmt.Sprint("msg-", n), APIType: outboxdb.APITypeHeartbeat, Status: status,
		Topic: "device-heartbeat", Partition: 1, Offset: n, KafkaKey: []byte("kk"),
		Payload: fmt.Appendf([]byte("\xc3\xff\x00"), "%d", n), Attempts: 3, DueIn: &due,
		LastHTTPStatus: httpStatus, LastError: fmt.Sprint("reason ", n),
	})[0]
}

type dlState struct {
	Published, Claimed, Available bool
}

func (b *testBundle) state(t testing.TB, id int64) dlState {
	t.Helper()
	var s dlState
	if err := b.pool.QueryRow(b.ctx, `SELECT dead_lettered_at IS NOT NULL, dead_letter_token IS NOT NULL,
			dead_lettered_at IS NULL AND (dead_letter_lease_until IS NULL OR dead_letter_lease_until <= now())
		FROM forward_records WHERE id = $1`, id).Scan(&s.Published, &s.Claimed, &s.Available); err != nil {
		t.Fatal(err)
	}
	return s
}

func read(t testing.TB, in *deadLetter) (service.MessageBatch, service.AckFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batch, ack, err := in.ReadBatch(ctx)
	if err != nil {
		t.Fatalf("ReadBatch: %v", err)
	}
	return batch, ack
}

func outboxID(t testing.TB, m *service.Message) int64 {
	t.Helper()
	v, ok := m.MetaGetMut(msgmeta.OutboxID)
	if !ok {
		t.Fatal("no outbox_id")
	}
	return v.(int64)
}

func batchIDs(t testing.TB, batch service.MessageBatch) []int64 {
	t.Helper()
	out := make([]int64, len(batch))
	for i, m := range batch {
		out[i] = outboxID(t, m)
	}
	return out
}

func TestDeadLetterInput(t *testing.T) {
	t.Parallel()

	t.Run("EmitsFailedRowsWithMetadata", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		withStatus := b.insert(t, "FAILED", 503)
		b.insert(t, "PENDING", 0)
		b.insert(t, "SUCCESS", 0)
		b.insert(t, "IN_PROGRESS", 0)
		noStatus := b.insert(t, "FAILED", 0)

		in := b.input(t, "")
		batch, _ := read(t, in)
		if got := batchIDs(t, batch); len(got) != 2 || got[0] != withStatus || got[1] != noStatus {
			t.Fatalf("emitted rows %v, want the FAILED ones %d and %d", got, withStatus, noStatus)
		}
		m := batch[0]
		body, _ := m.AsBytes()
		if string(body) != "\xc3\xff\x001" {
			t.Errorf("body %q, want the stored bytes", body)
		}
		want := map[string]string{
			msgmeta.MessageKey: "msg-1", msgmeta.APIType: "HEARTBEAT", msgmeta.LastError: "reason 1", msgmeta.LastHTTPStatus: "503",
			msgmeta.AttemptCount: "3", msgmeta.KafkaTopic: "device-heartbeat", msgmeta.KafkaPartition: "1", msgmeta.KafkaOffset: "1",
			msgmeta.KafkaKey: "kk", msgmeta.OutboxID: fmt.Sprint(withStatus),
		}
		for k, v := range want {
			if got, _ := m.MetaGet(k); got != v {
				t.Errorf("metadata %s = %q, want %q", k, got, v)
			}
		}
		for _, k := range []string{msgmeta.CreatedAtMs, msgmeta.FailedAtMs} {
			if v, ok := m.MetaGetMut(k); !ok || v.(int64) < time.Now().Add(-time.Hour).UnixMilli() {
				t.Errorf("metadata %s = %v", k, v)
			}
		}
		if _, ok := batch[1].MetaGet(msgmeta.LastHTTPStatus); ok {
			t.Error("last_http_status set for a row the platform never answered")
		}
		if s := b.state(t, withStatus); !s.Claimed || s.Published {
			t.Errorf("emitted row %+v, want claimed and not yet published", s)
		}
	})

	t.Run("AckMarksPublished", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "FAILED", 200)
		in := b.input(t, "poll_interval: 20ms")
		_, ack := read(t, in)
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if s := b.state(t, id); !s.Published || s.Claimed {
			t.Fatalf("acked row %+v, want published", s)
		}
		// Nothing more to emit: the next read waits until cancelled.
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		defer cancel()
		if batch, _, err := in.ReadBatch(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ReadBatch after the ack: %d messages, %v; want to wait", len(batch), err)
		}
	})

	t.Run("NoClaimBeforeTheProcessHasStarted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "FAILED", 200)
		in := b.input(t, "poll_interval: 20ms")
		in.started = launch.NewGate()
		in.started.Hold()
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		defer cancel()
		if batch, _, err := in.ReadBatch(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ReadBatch before the start: %d messages, %v; want to wait", len(batch), err)
		}
		if s := b.state(t, id); s.Claimed || !s.Available {
			t.Fatalf("row %+v before the start, want it unclaimed", s)
		}
		in.started.Open()
		if batch, _ := read(t, in); len(batch) != 1 || outboxID(t, batch[0]) != id {
			t.Fatalf("after the start: %d messages, want row %d", len(batch), id)
		}
	})

	t.Run("NackGivesTheRowsBackAfterThePollInterval", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "FAILED", 200)
		slow := b.input(t, "poll_interval: 1h")
		_, ack := read(t, slow)
		if err := ack(b.ctx, errors.New("broker down")); err != nil {
			t.Fatal(err)
		}
		if s := b.state(t, id); s.Published || s.Claimed || s.Available {
			t.Fatalf("nacked row %+v, want given back for later (an hour)", s)
		}

		// With a short interval the row comes back soon.
		id = b.insert(t, "FAILED", 200)
		fast := b.input(t, "poll_interval: 20ms")
		_, ack = read(t, fast)
		if err := ack(b.ctx, errors.New("broker down")); err != nil {
			t.Fatal(err)
		}
		batch, ack := read(t, fast)
		if got := batchIDs(t, batch); len(got) != 1 || got[0] != id {
			t.Fatalf("after the nack emitted %v, want row %d again", got, id)
		}
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if s := b.state(t, id); !s.Published {
			t.Fatalf("row %+v after the second ack", s)
		}
	})

	t.Run("PartialFailureMarksOnlyTheWrittenRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := []int64{b.insert(t, "FAILED", 200), b.insert(t, "FAILED", 200), b.insert(t, "FAILED", 200)}
		in := b.input(t, "poll_interval: 1h")
		batch, ack := read(t, in)
		// As an output reports it: a batch of its own (here reordered), with
		// one message failed.
		out := service.MessageBatch{batch[2], batch[1], batch[0]}
		bErr := service.NewBatchError(out, errors.New("one record rejected")).Failed(1, errors.New("too large"))
		if err := ack(b.ctx, bErr); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			s := b.state(t, id)
			if wantPublished := i != 1; s.Published != wantPublished || s.Claimed {
				t.Errorf("row %d: %+v, want published %v", i, s, wantPublished)
			}
		}
	})

	t.Run("CloseGivesBackUnacknowledgedRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acked, held := b.insert(t, "FAILED", 200), b.insert(t, "FAILED", 200)
		in := b.input(t, "batch_size: 1")
		_, ack := read(t, in)
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		read(t, in)
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if s := b.state(t, acked); !s.Published {
			t.Errorf("acked row %+v", s)
		}
		if s := b.state(t, held); s.Published || s.Claimed || !s.Available {
			t.Errorf("held row after Close %+v, want available at once", s)
		}
		if _, _, err := in.ReadBatch(b.ctx); !errors.Is(err, service.ErrEndOfInput) {
			t.Errorf("ReadBatch after Close: %v, want end of input", err)
		}
	})

	t.Run("CloseEndsAWaitingRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := b.input(t, "poll_interval: 1h")
		errc := make(chan error, 1)
		go func() {
			_, _, err := in.ReadBatch(b.ctx)
			errc <- err
		}()
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, service.ErrEndOfInput) {
			t.Fatalf("waiting ReadBatch returned %v, want end of input", err)
		}
	})

	t.Run("InstancesShareTheRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const rows = 300
		for range rows {
			b.insert(t, "FAILED", 200)
		}
		var (
			mu   sync.Mutex
			seen = map[int64]int{}
			wg   sync.WaitGroup
		)
		giveUp := time.Now().Add(time.Minute)
		for range 3 {
			in := b.input(t, "batch_size: 7\npoll_interval: 1h")
			wg.Go(func() {
				for {
					ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
					batch, ack, err := in.ReadBatch(ctx)
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						// Nothing came: done once every row is published (a
						// slow poll on a loaded machine is not the end).
						var left int
						if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM forward_records WHERE dead_lettered_at IS NULL`).Scan(&left); err != nil {
							t.Error(err)
							return
						}
						if left == 0 {
							return
						}
						if time.Now().After(giveUp) {
							t.Errorf("%d rows still unpublished after a minute", left)
							return
						}
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, m := range batch {
						seen[outboxID(t, m)]++
					}
					mu.Unlock()
					if err := ack(b.ctx, nil); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if len(seen) != rows {
			t.Fatalf("%d rows emitted, want %d", len(seen), rows)
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("row %d emitted %d times", id, n)
			}
		}
		if n := b.count(t, "dead_lettered_at IS NULL"); n != 0 {
			t.Errorf("%d rows not marked published", n)
		}
	})
}

func (b *testBundle) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM forward_records WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConfig(t *testing.T) {
	t.Parallel()
	parse := func(yaml string) (*deadLetter, error) {
		conf, err := deadLetterSpec().ParseYAML(yaml, nil)
		if err != nil {
			return nil, err
		}
		return newDeadLetterFromParsed(conf, service.MockResources())
	}

	in, err := parse("dsn: postgres://u:p@localhost:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	if in.batchSize != 100 || in.pollInterval != 5*time.Second || in.lease != time.Minute {
		t.Errorf("defaults: batch %d, poll %v, lease %v", in.batchSize, in.pollInterval, in.lease)
	}
	for yaml, want := range map[string]string{
		"batch_size: 0":     dlFieldBatchSize,
		"poll_interval: 0s": dlFieldPollInterval,
		"lease: 10ms":       dlFieldLease,
	} {
		if _, err := parse("dsn: postgres://localhost/db\n" + yaml); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %s", yaml, err, want)
		}
	}
	if _, err := parse(`dsn: "postgres://user:s3cret@host:notaport/db"`); err == nil ||
		!strings.Contains(err.Error(), "field dsn") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad dsn: error %v, want one naming the field without the password", err)
	}
}

// TestLifecycleLeavesNoGoroutines is not parallel, so only its own
// goroutines are counted.
func TestLifecycleLeavesNoGoroutines(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setup(t)
	b.insert(t, "FAILED", 200)
	in := b.input(t, "")
	_, ack := read(t, in)
	if err := ack(b.ctx, errors.New("nack")); err != nil {
		t.Fatal(err)
	}
	if err := in.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.pool.Close()
}
