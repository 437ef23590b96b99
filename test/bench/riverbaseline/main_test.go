package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRiverBaseline runs the baseline as the bench does, on a real
// PostgreSQL migrated by River's migrator and an in-process Kafka broker,
// against a platform that answers every message's first request "busy"
// (errcode 999) and refuses one message for good (998): every other message
// is delivered on River's retry, the refused one is cancelled after one
// request, and the consumer group's offsets are committed past every
// message.
func TestRiverBaseline(t *testing.T) {
	const n = 30
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	dsn := pgtest.NewEmptyDB(t)
	t.Setenv("DATABASE_URL", dsn)
	if err := migrate(ctx, log); err != nil {
		t.Fatal(err)
	}

	kafka, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(3, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	src, err := eventgen.NewSource(eventgen.SourceConfig{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	var refused string
	for i := range n {
		m := src.Next()
		if i == 0 {
			refused = m.MessageID
		}
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	mp, err := mockplatform.Start(mockplatform.Config{AccessName: "bench", AccessPwd: "secret", Faults: mockplatform.Faults{FirstTry999: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	mp.Reject(refused)

	for k, v := range map[string]string{
		"KAFKA_BROKERS": kafka.ListenAddrs()[0], "KAFKA_GROUP": "river-test",
		"PLATFORM_URL": mp.URL, "PLATFORM_ACCESS_NAME": "bench", "PLATFORM_ACCESS_PWD": "secret",
	} {
		t.Setenv(k, v)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, log, []string{"-workers", "4", "-batch-size", "7"}) }()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	type tally struct{ completed, cancelled, other, retried int }
	var got tally
	for {
		got = tally{}
		err := pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE state = 'completed'),
				count(*) FILTER (WHERE state = 'cancelled'),
				count(*) FILTER (WHERE state NOT IN ('completed', 'cancelled')),
				count(*) FILTER (WHERE state = 'completed' AND attempt = 2)
			FROM river_job`).Scan(&got.completed, &got.cancelled, &got.other, &got.retried)
		if err != nil {
			t.Fatal(err)
		}
		if got.completed+got.cancelled >= n && got.other == 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the baseline stopped early: %v", err)
		case <-ctx.Done():
			t.Fatalf("jobs %+v: not every message finished in time (platform: %+v)", got, mp.Stats())
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("the baseline's shutdown: %v", err)
	}

	if want := (tally{completed: n - 1, cancelled: 1, retried: n - 1}); got != want {
		t.Errorf("jobs %+v, want %+v: each message delivered on its second attempt, the refused one cancelled", got, want)
	}
	var refusedAttempts int
	if err := pool.QueryRow(ctx, `SELECT attempt FROM river_job WHERE state = 'cancelled' AND args->>'key' = $1`, refused).
		Scan(&refusedAttempts); err != nil {
		t.Fatalf("the refused message's job: %v", err)
	}
	if refusedAttempts != 1 {
		t.Errorf("the refused message was tried %d times, want once", refusedAttempts)
	}
	if st := mp.Stats(); st.Accepted != n-1 || st.Errcode998 != 1 || st.Errcode999 != n-1 || st.Requests != 2*(n-1)+1 {
		t.Errorf("platform %+v: want %d accepted after %d busy answers, 1 refusal, %d requests", st, n-1, n-1, 2*(n-1)+1)
	}

	adm := kadm.NewClient(producer)
	committed, err := adm.FetchOffsets(ctx, "river-test")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		c, _ := committed.Lookup(e.Topic, e.Partition)
		if c.At != e.Offset {
			t.Errorf("%s/%d: committed offset %d, want the end %d", e.Topic, e.Partition, c.At, e.Offset)
		}
	})
}
