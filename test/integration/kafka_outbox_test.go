// Package integration_test runs components of different plugins together
// in one process, against a real Kafka protocol peer (kfake) and a real
// PostgreSQL: the guarantees that no single plugin's tests can prove,
// since a plugin package never imports a sibling.
package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	_ "github.com/forwarder/forwarder/plugins/kafka"
	_ "github.com/forwarder/forwarder/plugins/outbox"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitTimeout bounds every wait: far above what a correct pipeline needs on
// a loaded machine, so a failure means a bug.
const waitTimeout = 90 * time.Second

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func vehicle(id string) []byte {
	return []byte(`{"messageId": "` + id + `", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012",
 "itemId": 73421, "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1, "inoutTime": 1779330600000,
 "plateCredible": 0.854, "pictures": [{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"}]}`)
}

// commitObservation is the group's committed offset of one partition, as
// read at a moment.
type commitObservation struct {
	partition int32
	offset    int64
}

// TestKafkaToOutboxOffsetsFollowRows runs the ingest half of
// pipelines/forwarder.yaml, kafka_franz → outbox (persist only), on kfake and
// a private PostgreSQL that is stopped mid-stream. Read from the broker,
// the group's committed offset of a partition never passes a record whose
// row is not committed in PostgreSQL (docs/guarantees.md: an offset is
// committed only after the rows up to it are), and once PostgreSQL is back
// every message has exactly one row and the offsets reach the end.
func TestKafkaToOutboxOffsetsFollowRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		topic      = "device-vehicle-event"
		group      = "forwarder"
		partitions = 3
		perPhase   = 300
	)
	cluster := pgtest.StartCluster(t)
	dsn := pgtest.NewDBOn(t, cluster)
	checker, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(checker.Close)

	kc := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: partitions}})
	produced := 0
	producePhase := func() {
		kc.ProduceN(t, topic, perPhase, func(i int) *kgo.Record {
			return &kgo.Record{Key: []byte("CAM-0001"), Value: vehicle(fmt.Sprintf("msg-%05d", produced+i))}
		})
		produced += perPhase
	}

	// The stream: what pipelines/forwarder.yaml runs as its ingest input.
	logs := &logbuf.Buffer{}
	conf := fmt.Sprintf(`
http:
  enabled: false
input:
  kafka_franz:
    seed_brokers: [ %q ]
    topics: [ %q ]
    consumer_group: %q
    commit_period: 100ms
    checkpoint_limit: 50
  processors:
    - outbox:
        dsn: %q
        api_types:
          %s: VEHICLE_EVENT
        emit: none
output:
  drop: {}
metrics:
  none: {}
shutdown_timeout: 20s
`, kc.Brokers(), topic, group, dsn, topic)
	stop := startStream(t, logs, slog.LevelDebug, conf)

	// Every committed offset is checked against PostgreSQL the moment it
	// is seen. While PostgreSQL is down it cannot be; those are kept and
	// checked afterwards against the rows committed before it stopped.
	var (
		mu         sync.Mutex
		down       bool
		downSeen   []commitObservation
		violations []string
	)
	rowsBelow := func(ctx context.Context, partition int32, offset int64, before *time.Time) (int64, error) {
		q := `SELECT count(*) FROM forward_records WHERE kafka_topic = $1 AND kafka_partition = $2 AND kafka_offset < $3`
		args := []any{topic, partition, offset}
		if before != nil {
			q += ` AND created_at < $4`
			args = append(args, *before)
		}
		var n int64
		err := checker.QueryRow(ctx, q, args...).Scan(&n)
		return n, err
	}
	check := func() {
		committed, err := kc.Admin(t).FetchOffsets(ctx, group)
		if err != nil {
			return // the group may not exist yet
		}
		mu.Lock()
		isDown := down
		mu.Unlock()
		committed.Each(func(o kadm.OffsetResponse) {
			if o.Topic != topic || o.Err != nil || o.At <= 0 {
				return
			}
			obs := commitObservation{o.Partition, o.At}
			if isDown {
				mu.Lock()
				downSeen = append(downSeen, obs)
				mu.Unlock()
				return
			}
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			n, err := rowsBelow(qctx, obs.partition, obs.offset, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && down:
				// PostgreSQL stopped between the two reads.
				downSeen = append(downSeen, obs)
			case err != nil:
				violations = append(violations, fmt.Sprintf("partition %d committed at %d: could not count its rows: %v", obs.partition, obs.offset, err))
			case n != obs.offset:
				violations = append(violations, fmt.Sprintf("partition %d committed at %d with %d rows below it", obs.partition, obs.offset, n))
			}
		})
	}
	stopChecking := make(chan struct{})
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for {
			select {
			case <-stopChecking:
				return
			case <-time.After(20 * time.Millisecond):
			}
			check()
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stopChecking:
		default:
			close(stopChecking)
		}
		<-checked
	})

	committedAt := func(want int64) func() bool {
		return func() bool {
			got := kc.Committed(t, group)[topic]
			for p, end := range kc.EndOffsets(t, topic) {
				if end != want/partitions || got[p] != end {
					return false
				}
			}
			return true
		}
	}

	// Phase 1: PostgreSQL up.
	producePhase()
	waitFor(t, "the commits of phase 1", committedAt(int64(produced)))

	// Phase 2: PostgreSQL stopped while messages keep coming.
	var stoppedAt time.Time
	if err := checker.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&stoppedAt); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	down = true
	mu.Unlock()
	checker.Reset() // its connections die with the server
	if err := cluster.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	producePhase()
	// Let the outbox fail on the new records and keep retrying for a few
	// commit periods: an offset committed now would be a violation.
	waitFor(t, "the outbox to report the outage", func() bool {
		return strings.Contains(logs.String(), "level=ERROR") && strings.Contains(logs.String(), "processors")
	})
	time.Sleep(time.Second)

	// Phase 3: PostgreSQL back.
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	waitFor(t, "the commits of phase 2 after the restart", committedAt(int64(produced)))
	producePhase()
	waitFor(t, "the commits of phase 3", committedAt(int64(produced)))

	close(stopChecking)
	<-checked
	if err := stop(); err != nil {
		t.Fatalf("stopping the stream: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	// Commits seen while PostgreSQL was down must be covered by rows
	// committed before it stopped.
	if len(downSeen) == 0 {
		t.Error("no committed offset was read while PostgreSQL was down; the outage window proves nothing")
	}
	for _, obs := range downSeen {
		n, err := rowsBelow(ctx, obs.partition, obs.offset, &stoppedAt)
		if err != nil {
			t.Fatal(err)
		}
		if n != obs.offset {
			t.Errorf("partition %d committed at %d while PostgreSQL was down, with %d rows below it written before it stopped", obs.partition, obs.offset, n)
		}
	}

	// Every message has exactly one row, at its own offset.
	rows, err := checker.Query(ctx, `SELECT message_key, kafka_partition, kafka_offset FROM forward_records WHERE kafka_topic = $1`, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type place struct {
		partition int32
		offset    int64
	}
	byKey := map[string]place{}
	byPlace := map[place]string{}
	for rows.Next() {
		var (
			key string
			pl  place
		)
		if err := rows.Scan(&key, &pl.partition, &pl.offset); err != nil {
			t.Fatal(err)
		}
		if prev, dup := byPlace[pl]; dup {
			t.Errorf("partition %d offset %d has two rows: %s and %s", pl.partition, pl.offset, prev, key)
		}
		byKey[key], byPlace[pl] = pl, key
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(byKey) != produced {
		t.Errorf("%d rows, want one per message: %d", len(byKey), produced)
	}
	for i := range produced {
		if _, ok := byKey[fmt.Sprintf("msg-%05d", i)]; !ok {
			t.Errorf("message msg-%05d has no row", i)
		}
	}
	for p, end := range kc.EndOffsets(t, topic) {
		for o := range end {
			if _, ok := byPlace[place{p, o}]; !ok {
				t.Errorf("partition %d offset %d has no row", p, o)
			}
		}
	}
}
