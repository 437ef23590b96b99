package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestDroppedMessagesFail runs a stream whose mapping deletes two of the
// events of one berth (root = deleted(), as an operator editing a mapping
// might). Their rows are acknowledged without a result; each becomes FAILED
// at its first attempt, as invalid, saying the pipeline dropped it, and the
// berth's later events are delivered behind it (ORDER_ON_FAILED=skip).
// Left to their lease they would come back again and again, holding the
// berth, until out of attempts.
func TestDroppedMessagesFail(t *testing.T) {
	t.Parallel()
	const (
		topic = "dropped"
		n     = 12
	)
	dropped := map[string]bool{"dropped-03": true, "dropped-07": true}
	kc := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	platform, url := newPlatformLog(t)
	dsn, pool := pgtest.NewDBPool(t)
	mapping := `root = if ["dropped-03", "dropped-07"].contains(this.messageId) { deleted() } else { this }`
	startStream(t, &logbuf.Buffer{}, slog.LevelInfo, fullStream(kc.Brokers(), topic, dsn, url, mapping, ""))
	produceAndFinish(t, kc, pool, topic, n)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT message_key, status, coalesce(failure_class, ''), coalesce(last_error, ''), attempt_count
		FROM forward_records ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key, status, class, lastErr string
			attempts                    int
		)
		if err := rows.Scan(&key, &status, &class, &lastErr, &attempts); err != nil {
			t.Fatal(err)
		}
		switch {
		case !dropped[key] && status != "SUCCESS":
			t.Errorf("%s: %s (%s), want SUCCESS: the berth's later events go on", key, status, lastErr)
		case dropped[key] && (status != "FAILED" || class != "INVALID" || attempts != 1 || !strings.Contains(lastErr, "the pipeline dropped the message")):
			t.Errorf("%s: %s %s at attempt %d: %q; want FAILED INVALID at attempt 1, saying the pipeline dropped it", key, status, class, attempts, lastErr)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := platform.snapshot()
	for i := range n {
		key := fmt.Sprintf("%s-%02d", topic, i)
		if want := map[bool]int{true: 0, false: 1}[dropped[key]]; got[key] != want {
			t.Errorf("the platform received %s %d times, want %d", key, got[key], want)
		}
	}
}

// TestMetadataDeletedByTheMappingKeepsTheClaim: a mapping file ending in
// meta = deleted() (to keep metadata out of a request) still has every
// message delivered at its first attempt: the claim the output records the
// result by survives the mapping_file processor.
func TestMetadataDeletedByTheMappingKeepsTheClaim(t *testing.T) {
	t.Parallel()
	const (
		topic = "stripped"
		n     = 6
	)
	kc := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	platform, url := newPlatformLog(t)
	dsn, pool := pgtest.NewDBPool(t)
	path := filepath.Join(t.TempDir(), "stripped.blobl")
	if err := os.WriteFile(path, []byte("root = this\nmeta = deleted()\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fullStream(kc.Brokers(), topic, dsn, url, passThrough, "")
	withFile := strings.Replace(conf, fmt.Sprintf("- mapping: %q", passThrough), fmt.Sprintf("- mapping_file:\n        path: %q", path), 1)
	if withFile == conf {
		t.Fatal("the stream has no mapping processor to replace")
	}
	startStream(t, &logbuf.Buffer{}, slog.LevelInfo, withFile)
	produceAndFinish(t, kc, pool, topic, n)
	ctx := context.Background()
	var delivered int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE status = 'SUCCESS' AND attempt_count = 1`).Scan(&delivered); err != nil {
		t.Fatal(err)
	}
	if delivered != n {
		t.Errorf("%d of %d rows SUCCESS at their first attempt", delivered, n)
	}
	got := platform.snapshot()
	for i := range n {
		if key := fmt.Sprintf("%s-%02d", topic, i); got[key] != 1 {
			t.Errorf("the platform received %s %d times, want 1", key, got[key])
		}
	}
}

// produceAndFinish writes n vehicle events, <topic>-00 on, to topic and
// waits until each has a finished row.
func produceAndFinish(t *testing.T, kc *kafkatest.Cluster, pool *pgxpool.Pool, topic string, n int) {
	t.Helper()
	kc.ProduceN(t, topic, n, func(i int) *kgo.Record {
		return &kgo.Record{Value: vehicle(fmt.Sprintf("%s-%02d", topic, i))}
	})
	waitFor(t, "every row finished", func() bool {
		var finished int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM forward_records WHERE status IN ('SUCCESS', 'FAILED')`).Scan(&finished)
		return err == nil && finished == n
	})
}
