package outboxretry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/dispatch"
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
	// res are the resources of the bundle's stream: inputs made by newInput
	// belong to it.
	res *service.Resources
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	return &testBundle{ctx: context.Background(), dsn: dsn, pool: pool, res: service.MockResources()}
}

// input builds, connects and (at the end of the test) closes an outbox_retry
// input; extra is YAML added to the config.
func (b *testBundle) input(t testing.TB, extra string) *outboxRetry {
	t.Helper()
	in := b.newInput(t, extra)
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	return in
}

func (b *testBundle) newInput(t testing.TB, extra string) *outboxRetry {
	t.Helper()
	conf, err := outboxRetrySpec().ParseYAML(fmt.Sprintf("dsn: %q\n%s", b.dsn, extra), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each input is the dispatcher of a stream of its own, unless the test
	// builds another component on b.res itself.
	res := b.res
	if hub, _ := dispatch.HubFor(res, b.dsn); hub.Dispatcher() != nil {
		res = service.MockResources()
	}
	in, err := newOutboxRetryFromParsed(conf, res)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(context.Background()) })
	return in
}

// insertDue inserts n PENDING rows due now and returns their ids in order.
func (b *testBundle) insertDue(t testing.TB, n int) []int64 {
	t.Helper()
	first := b.keys.Add(int64(n)) - int64(n)
	rows, err := b.pool.Query(b.ctx, `WITH m AS (
		INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, kafka_key, payload)
		SELECT 'msg-' || ($1::bigint + g), 'VEHICLE_EVENT', 'device-vehicle-event', 2, $1::bigint + g,
		       convert_to('key-' || g, 'UTF8'), convert_to('{"n":' || g || '}', 'UTF8')
		FROM generate_series(1, $2::integer) g
		ORDER BY g
		RETURNING id, created_at, message_key, payload
		)
		INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
		SELECT id, created_at, message_key, 'PENDING', now(), octet_length(payload) FROM m
		RETURNING id`, first, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

func (b *testBundle) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM forward_records WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type rowState struct {
	Status       string
	AttemptCount int
	ClaimToken   *string
	ClaimedBy    *string
	Due          bool
}

func (b *testBundle) row(t testing.TB, id int64) rowState {
	t.Helper()
	var s rowState
	if err := b.pool.QueryRow(b.ctx, `SELECT status, attempt_count, claim_token::text, claimed_by,
			coalesce(next_retry_at <= now(), false)
		FROM forward_records WHERE id = $1`, id).Scan(&s.Status, &s.AttemptCount, &s.ClaimToken, &s.ClaimedBy, &s.Due); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *testBundle) logStatuses(t testing.TB, id int64) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT result_status FROM forward_retry_logs WHERE record_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func read(t testing.TB, in *outboxRetry) (service.MessageBatch, service.AckFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batch, ack, err := in.ReadBatch(ctx)
	if err != nil {
		t.Fatalf("ReadBatch: %v", err)
	}
	return batch, ack
}

func meta(t testing.TB, m *service.Message, key string) string {
	t.Helper()
	v, ok := m.MetaGet(key)
	if !ok {
		t.Fatalf("metadata %s missing", key)
	}
	return v
}

func metaInt(t testing.TB, m *service.Message, key string) int64 {
	t.Helper()
	v, ok := m.MetaGetMut(key)
	if !ok {
		t.Fatalf("metadata %s missing", key)
	}
	n, ok := v.(int64)
	if !ok {
		t.Fatalf("metadata %s is %T, want int64", key, v)
	}
	return n
}

func TestOutboxRetry(t *testing.T) {
	t.Parallel()

	t.Run("EmitsRowsWithMetadata", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insertDue(t, 3)
		if _, err := b.pool.Exec(b.ctx, `WITH m AS (
			UPDATE forward_messages SET payload = '\xff00c3', kafka_key = NULL WHERE id = $1
			RETURNING id, octet_length(payload) AS size
		)
		UPDATE forward_deliveries d SET payload_size = m.size FROM m WHERE d.id = m.id`, ids[2]); err != nil {
			t.Fatal(err)
		}
		in := b.input(t, "instance_id: dispatcher-1\nlease: 90s")
		batch, ack := read(t, in)
		if len(batch) != 3 {
			t.Fatalf("batch of %d, want 3", len(batch))
		}
		var created time.Time
		if err := b.pool.QueryRow(b.ctx, "SELECT created_at FROM forward_records WHERE id = $1", ids[0]).Scan(&created); err != nil {
			t.Fatal(err)
		}
		for i, m := range batch {
			s := b.row(t, ids[i])
			if got := metaInt(t, m, msgmeta.OutboxID); got != ids[i] {
				t.Errorf("message %d: outbox_id %d, want %d", i, got, ids[i])
			}
			if s.Status != "IN_PROGRESS" || s.ClaimToken == nil || meta(t, m, msgmeta.ClaimToken) != *s.ClaimToken ||
				s.ClaimedBy == nil || *s.ClaimedBy != "dispatcher-1" {
				t.Errorf("message %d: row %+v, claim_token %q", i, s, meta(t, m, msgmeta.ClaimToken))
			}
			if metaInt(t, m, msgmeta.Attempt) != 1 || meta(t, m, msgmeta.Attempt) != "1" {
				t.Errorf("message %d: attempt %v", i, meta(t, m, msgmeta.Attempt))
			}
			if meta(t, m, msgmeta.MessageKey) == "" || meta(t, m, msgmeta.APIType) != "VEHICLE_EVENT" ||
				meta(t, m, msgmeta.KafkaTopic) != "device-vehicle-event" || metaInt(t, m, msgmeta.KafkaPartition) != 2 {
				t.Errorf("message %d: metadata", i)
			}
			createdMs, leaseMs := metaInt(t, m, msgmeta.CreatedAtMs), metaInt(t, m, msgmeta.LeaseExpiresAtMs)
			if createdMs != created.UnixMilli() || leaseMs < createdMs+89_000 {
				t.Errorf("message %d: created %d (want %d), lease ends %d", i, createdMs, created.UnixMilli(), leaseMs)
			}
		}
		if k := meta(t, batch[0], msgmeta.KafkaKey); k != "key-1" {
			t.Errorf("kafka_key %q", k)
		}
		if k := meta(t, batch[2], msgmeta.KafkaKey); k != "" {
			t.Errorf("kafka_key of a keyless record %q, want empty", k)
		}
		if p, _ := batch[2].AsBytes(); string(p) != "\xff\x00\xc3" {
			t.Errorf("payload %x, want the stored bytes ff00c3", p)
		}
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if n := in.d.Ledger().Held(); n != 0 {
			t.Errorf("%d rows still held after the ack", n)
		}
	})

	t.Run("ThreeInputsClaimEachRowOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const rows = 10_000
		b.insertDue(t, rows)

		ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
		defer cancel()
		var (
			mu      sync.Mutex
			seen    = map[int64][]string{}
			tokens  = map[int64]string{}
			perPeer = map[string]int{}
			wg      sync.WaitGroup
			total   atomic.Int64
			errs    = make(chan error, 3)
		)
		for i := range 3 {
			name := fmt.Sprintf("instance-%d", i)
			in := b.input(t, "instance_id: "+name+"\nbatch_size: 100\npoll_interval: 50ms")
			wg.Go(func() {
				for total.Load() < rows {
					batch, ack, err := in.ReadBatch(ctx)
					if err != nil {
						if total.Load() < rows {
							errs <- fmt.Errorf("%s: %w", name, err)
						}
						return
					}
					mu.Lock()
					for _, m := range batch {
						id := metaInt(t, m, msgmeta.OutboxID)
						seen[id] = append(seen[id], name)
						tokens[id] = meta(t, m, msgmeta.ClaimToken)
					}
					perPeer[name] += len(batch)
					mu.Unlock()
					if total.Add(int64(len(batch))) >= rows {
						cancel() // wake the others
					}
					// The output would have written results; here the rows
					// simply stay leased to their holder.
					_ = ack(ctx, nil)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if len(seen) != rows {
			t.Fatalf("claimed %d distinct rows, want %d", len(seen), rows)
		}
		for id, by := range seen {
			if len(by) != 1 {
				t.Fatalf("row %d claimed by %v while its lease held", id, by)
			}
		}
		// The database agrees: one attempt each, held by the claimer with the
		// token the message carried.
		var mismatched int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM forward_records r
			JOIN unnest($1::bigint[], $2::text[], $3::text[]) AS m(id, token, holder) ON m.id = r.id
			WHERE r.status <> 'IN_PROGRESS' OR r.attempt_count <> 1
			   OR r.claim_token::text <> m.token OR r.claimed_by <> m.holder`,
			idsOf(seen), tokensOf(seen, tokens), holdersOf(seen)).Scan(&mismatched); err != nil {
			t.Fatal(err)
		}
		if mismatched != 0 {
			t.Fatalf("%d rows disagree with what their messages carried", mismatched)
		}
		t.Logf("rows per instance: %v", perPeer)
	})

	t.Run("ExpiredLeaseIsRescuedAndStaleNackChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertDue(t, 1)[0]
		vanished := b.input(t, "instance_id: vanished")
		rescuer := b.input(t, "instance_id: rescuer")

		staleBatch, staleAck := read(t, vanished)
		if len(staleBatch) != 1 || metaInt(t, staleBatch[0], msgmeta.Attempt) != 1 {
			t.Fatalf("first claim: %d messages", len(staleBatch))
		}
		// The holder hangs past its lease.
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		batch, ack := read(t, rescuer)
		if len(batch) != 1 || metaInt(t, batch[0], msgmeta.OutboxID) != id {
			t.Fatalf("rescuer got %d messages, want row %d", len(batch), id)
		}
		if a := metaInt(t, batch[0], msgmeta.Attempt); a != 2 {
			t.Fatalf("rescued attempt %d, want 2", a)
		}
		newToken := meta(t, batch[0], msgmeta.ClaimToken)
		if newToken == meta(t, staleBatch[0], msgmeta.ClaimToken) {
			t.Fatal("rescue kept the stale claim token")
		}
		if logs := b.logStatuses(t, id); !slices.Equal(logs, []string{"LEASE_EXPIRED"}) {
			t.Fatalf("attempt logs %v, want [LEASE_EXPIRED]", logs)
		}

		// The stale holder wakes up and nacks: its fenced release changes nothing.
		if err := staleAck(b.ctx, errors.New("late failure")); err != nil {
			t.Fatal(err)
		}
		s := b.row(t, id)
		if s.Status != "IN_PROGRESS" || s.AttemptCount != 2 || *s.ClaimToken != newToken || *s.ClaimedBy != "rescuer" {
			t.Fatalf("row after the stale nack: %+v, want the rescuer's claim intact", s)
		}
		if logs := b.logStatuses(t, id); len(logs) != 1 {
			t.Fatalf("the stale nack logged something: %v", logs)
		}
		if err := ack(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RowOutOfAttemptsIsFailedNotSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insertDue(t, 2)
		if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET status = 'IN_PROGRESS', attempt_count = 2,
			claim_token = gen_random_uuid(), claimed_by = 'crashed', next_retry_at = now() - interval '1 second'
			WHERE id = $1`, ids[0]); err != nil {
			t.Fatal(err)
		}
		in := b.input(t, "max_attempts: 2")
		batch, _ := read(t, in)
		if len(batch) != 1 || metaInt(t, batch[0], msgmeta.OutboxID) != ids[1] {
			t.Fatalf("got %d messages, want only row %d", len(batch), ids[1])
		}
		if s := b.row(t, ids[0]); s.Status != "FAILED" || s.AttemptCount != 2 {
			t.Fatalf("exhausted row %+v, want FAILED after 2 attempts", s)
		}
	})

	t.Run("NotifyWakesIdleInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		listening := make(chan struct{}, 8)
		idle := make(chan struct{}, 64)
		// Only a notification can wake it: nothing is due and the poll is an hour.
		in := b.newInput(t, "poll_interval: 1h")
		in.d.OnListen = func() { listening <- struct{}{} }
		in.d.OnIdle = func() { idle <- struct{}{} }
		if err := in.Connect(b.ctx); err != nil {
			t.Fatal(err)
		}
		<-listening

		const rounds = 15
		latencies := make([]time.Duration, 0, rounds)
		for i := range rounds {
			type result struct {
				batch service.MessageBatch
				ack   service.AckFunc
				err   error
			}
			drainAll(idle)
			got := make(chan result, 1)
			ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			go func() {
				batch, ack, err := in.ReadBatch(ctx)
				got <- result{batch, ack, err}
			}()
			<-idle // claimed nothing, now waiting

			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id int64
			if err := tx.QueryRow(b.ctx, `WITH m AS (
					INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
					VALUES ($1, 'HEARTBEAT', 'device-heartbeat', 0, $2, '{}')
					RETURNING id, created_at, message_key, octet_length(payload) AS size
				)
				INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
				SELECT id, created_at, message_key, 'PENDING', now(), size FROM m
				RETURNING id`,
				fmt.Sprintf("notified-%d", i), i).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(b.ctx, "SELECT pg_notify($1, '')", outboxdb.NotifyChannel); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			r := <-got
			latencies = append(latencies, time.Since(committed))
			cancel()
			if r.err != nil {
				t.Fatalf("round %d: the notification did not wake the input: %v", i, r.err)
			}
			if len(r.batch) != 1 || metaInt(t, r.batch[0], msgmeta.OutboxID) != id {
				t.Fatalf("round %d: got %d messages, want row %d", i, len(r.batch), id)
			}
			if err := r.ack(b.ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(latencies)
		t.Logf("notify→claim latency over %d rounds: median %v, min %v, max %v",
			rounds, latencies[rounds/2], latencies[0], latencies[rounds-1])
	})

	t.Run("NackedRowIsDueAgainAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertDue(t, 1)[0]
		in := b.input(t, "poll_interval: 1h")
		batch, ack := read(t, in)
		if err := ack(b.ctx, errors.New("output unavailable")); err != nil {
			t.Fatal(err)
		}
		s := b.row(t, id)
		if s.Status != "PENDING" || !s.Due || s.ClaimToken != nil || s.AttemptCount != 1 {
			t.Fatalf("row after the nack: %+v, want PENDING and due now with the attempt counted", s)
		}
		if logs := b.logStatuses(t, id); !slices.Equal(logs, []string{"PENDING"}) {
			t.Fatalf("logs %v, want the nacked attempt", logs)
		}
		again, ack2 := read(t, in)
		if len(again) != 1 || metaInt(t, again[0], msgmeta.OutboxID) != id || metaInt(t, again[0], msgmeta.Attempt) != 2 ||
			meta(t, again[0], msgmeta.ClaimToken) == meta(t, batch[0], msgmeta.ClaimToken) {
			t.Fatalf("after the nack got %d messages, want row %d at attempt 2 with a new token", len(again), id)
		}
		if err := ack2(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NackDelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertDue(t, 1)[0]
		in := b.input(t, "nack_delay: 1h")
		_, ack := read(t, in)
		if err := ack(b.ctx, errors.New("output unavailable")); err != nil {
			t.Fatal(err)
		}
		if s := b.row(t, id); s.Status != "PENDING" || s.Due {
			t.Fatalf("row %+v, want PENDING and not due yet", s)
		}
	})

	t.Run("MaxUnackedBoundsClaims", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insertDue(t, 400)
		in := b.input(t, "batch_size: 100\nmax_unacked: 150")
		first, ack1 := read(t, in)
		second, _ := read(t, in)
		if len(first) != 100 || len(second) != 50 {
			t.Fatalf("batches of %d and %d, want 100 and 50", len(first), len(second))
		}
		// Full: a read claims nothing until an ack frees room.
		ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
		_, _, err := in.ReadBatch(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("read while full: %v, want it to wait", err)
		}
		if n := b.count(t, "status = 'IN_PROGRESS'"); n != 150 {
			t.Fatalf("%d rows IN_PROGRESS, want 150", n)
		}
		if err := ack1(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		third, _ := read(t, in)
		if len(third) != 100 {
			t.Fatalf("after the ack: batch of %d, want 100", len(third))
		}
	})

	t.Run("CloseReleasesHeldRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insertDue(t, 30)
		in := b.input(t, "batch_size: 10")
		_, ack1 := read(t, in)
		read(t, in) // never acked: in flight at a forced stop
		if err := ack1(b.ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := in.Close(b.ctx); err != nil {
			t.Fatal(err)
		}
		if n := b.count(t, "status = 'IN_PROGRESS' AND claimed_by IS NOT NULL AND id <> ALL($1)", ids[:10]); n != 0 {
			t.Fatalf("%d rows left IN_PROGRESS after Close", n)
		}
		for _, id := range ids[10:20] {
			if s := b.row(t, id); s.Status != "PENDING" || !s.Due || s.ClaimToken != nil || s.AttemptCount != 1 {
				t.Fatalf("row %d after Close: %+v, want PENDING, due now", id, s)
			}
		}
		if _, _, err := in.ReadBatch(b.ctx); !errors.Is(err, service.ErrEndOfInput) {
			t.Fatalf("read after Close: %v, want ErrEndOfInput", err)
		}
	})

	t.Run("ShutdownLeavesNothingInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const rows = 3000
		b.insertDue(t, rows)

		sb := service.NewStreamBuilder()
		if err := sb.SetLoggerYAML("level: warn"); err != nil {
			t.Fatal(err)
		}
		if err := sb.AddInputYAML(fmt.Sprintf(`
outbox_retry:
  dsn: %q
  instance_id: graceful
  batch_size: 50
  max_unacked: 400
`, b.dsn)); err != nil {
			t.Fatal(err)
		}
		var batches atomic.Int64
		enough := make(chan struct{})
		// The output: records SUCCESS fenced by the claim for most batches,
		// fails every third one (a nack), slowly enough that batches are in
		// flight when the stream stops.
		if err := sb.AddBatchConsumerFunc(func(ctx context.Context, batch service.MessageBatch) error {
			n := batches.Add(1)
			if n == 10 {
				close(enough)
			}
			time.Sleep(5 * time.Millisecond)
			if n%3 == 0 {
				return errors.New("platform unreachable")
			}
			for _, m := range batch {
				id, _ := m.MetaGetMut(msgmeta.OutboxID)
				token, _ := m.MetaGet(msgmeta.ClaimToken)
				if _, err := fixture.Deliver(ctx, b.pool,
					"id = $1 AND claim_token::text = $2 AND status = 'IN_PROGRESS'", id, token); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		stream, err := sb.Build()
		if err != nil {
			t.Fatal(err)
		}
		runErr := make(chan error, 1)
		go func() { runErr <- stream.Run(b.ctx) }()
		select {
		case <-enough:
		case err := <-runErr:
			t.Fatalf("stream ended early: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("stream consumed nothing")
		}
		stopCtx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		if err := stream.Stop(stopCtx); err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
		<-runErr

		if n := b.count(t, "status = 'IN_PROGRESS'"); n != 0 {
			t.Fatalf("%d rows left IN_PROGRESS after a graceful shutdown", n)
		}
		if n := b.count(t, "status = 'PENDING' AND (claim_token IS NOT NULL OR next_retry_at > now())"); n != 0 {
			t.Fatalf("%d released rows still claimed or not due", n)
		}
		done := b.count(t, "status = 'SUCCESS'")
		if done == 0 || done == rows {
			t.Fatalf("%d of %d rows SUCCESS; the test wants a shutdown in the middle", done, rows)
		}
		nacked := b.count(t, "status = 'PENDING' AND last_error LIKE 'nacked:%'")
		if nacked == 0 {
			t.Error("no nacked rows were released")
		}
		t.Logf("%d batches consumed: %d rows SUCCESS, %d released by nacks, %d released at shutdown, %d never claimed",
			batches.Load(), done, nacked, b.count(t, "last_error LIKE 'released at shutdown%'"), b.count(t, "attempt_count = 0"))
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()

	parse := func(yaml string) (*outboxRetry, error) {
		conf, err := outboxRetrySpec().ParseYAML(yaml, nil)
		if err != nil {
			return nil, err
		}
		return newOutboxRetryFromParsed(conf, service.MockResources())
	}

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		in, err := parse(`dsn: postgres://u:p@localhost:5432/db`)
		if err != nil {
			t.Fatal(err)
		}
		c := in.d.Config()
		if c.BatchSize != 100 || c.Lease != time.Minute || c.PollInterval != 5*time.Second ||
			c.MaxUnacked != 300 || c.MaxUnackedBytes != 64<<20 || c.MaxAttempts != 0 || in.d.MaxAttempts() != 5 || c.NackDelay != 0 {
			t.Fatalf("defaults %+v (max attempts %d)", c, in.d.MaxAttempts())
		}
		if !strings.Contains(c.Claimer, "-") {
			t.Fatalf("instance id %q, want host-pid", c.Claimer)
		}
	})

	for _, c := range []struct {
		name, yaml, want string
	}{
		{"BatchSize", "batch_size: 0", "batch_size"},
		{"Lease", "lease: 10ms", "lease"},
		{"PollInterval", "poll_interval: 0s", "poll_interval"},
		{"MaxUnacked", "max_unacked: 0", "max_unacked"},
		{"MaxAttempts", "max_attempts: 0", "max_attempts"},
		{"MoreAttemptsThanARowCounts", "max_attempts: 2147483648", "max_attempts: 2147483648 must be from 1 to 2147483647"},
		{"NackDelay", "nack_delay: -1s", "nack_delay"},
		{"MaxUnackedBytes", "max_unacked_bytes: lots", "max_unacked_bytes"},
		{"MaxUnackedBytesAbove4EiB", "max_unacked_bytes: 5EiB", `max_unacked_bytes: "5EiB" is more than 4EiB`},
		{"MaxUnackedDirect", "max_unacked_direct: -1", "max_unacked_direct"},
		{"RequeueRoundsBeyondTheColumn", "failed_requeue:\n  rounds: 2147483648", "failed_requeue.rounds: 2147483648 is more than 2147483647"},
	} {
		t.Run("Rejects"+c.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse("dsn: postgres://localhost/db\n" + c.yaml)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %s", err, c.want)
			}
		})
	}

	// The largest budget lint accepts (OUTBOX_MAX_UNACKED_BYTES) starts.
	t.Run("TakesTheLargestByteBudget", func(t *testing.T) {
		t.Parallel()
		in, err := parse("dsn: postgres://localhost/db\nmax_unacked_bytes: 4EiB")
		if err != nil {
			t.Fatal(err)
		}
		if got := in.d.Config().MaxUnackedBytes; got != outboxdb.MaxByteBudget {
			t.Fatalf("max_unacked_bytes %d, want %d", got, int64(outboxdb.MaxByteBudget))
		}
	})

	t.Run("BadDSNIsNotEchoed", func(t *testing.T) {
		t.Parallel()
		_, err := parse(`dsn: "postgres://user:s3cret@host:notaport/db"`)
		if err == nil || !strings.Contains(err.Error(), "dsn") || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("error %v, want one naming the dsn field without the password", err)
		}
	})

	t.Run("LintsInAStream", func(t *testing.T) {
		t.Parallel()
		sb := service.NewStreamBuilder()
		if err := sb.AddInputYAML(`
outbox_retry:
  dsn: postgres://localhost/forwarder
  batch_size: 500
  lease: 60s
  poll_interval: 5s
  instance_id: a
  max_unacked: 2000
  max_unacked_bytes: 16MiB
  max_attempts: 5
`); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLifecycleLeavesNoGoroutines is not parallel: it runs while the
// parallel tests wait, so only its own goroutines are counted.
func TestLifecycleLeavesNoGoroutines(t *testing.T) {
	// Registered first, so it runs after every other cleanup (pools, databases).
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	b := setup(t)
	b.insertDue(t, 5)
	in := b.newInput(t, "")
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	batch, ack := read(t, in)
	if err := ack(b.ctx, errors.New("nack")); err != nil {
		t.Fatal(err)
	}
	if len(batch) != 5 {
		t.Fatalf("batch of %d", len(batch))
	}
	if err := in.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.pool.Close()
}

func drainAll(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

func idsOf(seen map[int64][]string) []int64 {
	ids := make([]int64, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func tokensOf(seen map[int64][]string, tokens map[int64]string) []string {
	out := make([]string, 0, len(seen))
	for _, id := range idsOf(seen) {
		out = append(out, tokens[id])
	}
	return out
}

func holdersOf(seen map[int64][]string) []string {
	out := make([]string, 0, len(seen))
	for _, id := range idsOf(seen) {
		out = append(out, seen[id][0])
	}
	return out
}

// TestSurvivesDatabaseRestart stops PostgreSQL under an idle input and starts
// it again: the input re-LISTENs by itself and a NOTIFY after the restart
// still gets the new row claimed (the poll is an hour, so nothing else could).
func TestSurvivesDatabaseRestart(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t)
	b := &testBundle{ctx: context.Background(), dsn: pgtest.NewDBOn(t, c), res: service.MockResources()}

	listens := make(chan struct{}, 16)
	in := b.newInput(t, "poll_interval: 1h")
	in.d.OnListen = func() { listens <- struct{}{} }
	if err := in.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	waitFor("LISTEN", listens)

	// An idle read is under way while the server goes away.
	type result struct {
		batch service.MessageBatch
		err   error
	}
	ctx, cancel := context.WithTimeout(b.ctx, 120*time.Second)
	defer cancel()
	got := make(chan result, 1)
	go func() {
		for {
			batch, ack, err := in.ReadBatch(ctx)
			if err == nil {
				_ = ack(ctx, nil)
				got <- result{batch: batch}
				return
			}
			if ctx.Err() != nil {
				got <- result{err: err}
				return
			}
			// The engine would back off and reconnect; so does the test.
			if errors.Is(err, service.ErrNotConnected) {
				for in.Connect(ctx) != nil && ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond)
				}
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()

	if err := c.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("LISTEN after the restart", listens)

	pool, err := outboxdb.Open(b.ctx, b.dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b.pool = pool
	id := b.insertDue(t, 1)[0]
	if _, err := pool.Exec(b.ctx, "SELECT pg_notify($1, '')", outboxdb.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("no row claimed after the restart: %v", r.err)
	}
	if len(r.batch) != 1 || metaInt(t, r.batch[0], msgmeta.OutboxID) != id {
		t.Fatalf("got %d messages, want row %d", len(r.batch), id)
	}
}
