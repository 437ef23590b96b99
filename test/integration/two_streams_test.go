package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	_ "github.com/forwarder/forwarder/plugins/all"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// platformLog records the messageId of every request a platform receives.
type platformLog struct {
	mu  sync.Mutex
	ids map[string]int
}

func newPlatformLog(t *testing.T) (*platformLog, string) {
	p := &platformLog{ids: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			MessageID string `json:"messageId"`
		}
		_ = json.Unmarshal(body, &m)
		p.mu.Lock()
		p.ids[m.MessageID]++
		p.mu.Unlock()
		_, _ = w.Write([]byte(`{"result":0}`))
	}))
	t.Cleanup(srv.Close)
	return p, srv.URL
}

func (p *platformLog) snapshot() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.ids))
	for k, v := range p.ids {
		out[k] = v
	}
	return out
}

// fullStream is the config of pipelines/forwarder.yaml reduced to what routing depends
// on: ingest (kafka_franz → outbox), dispatch (outbox_retry, direct
// dispatch included), one mapping (passThrough, or one of the test's) and
// http_forwarder, all on the database dsn names. extra holds more of the
// stream's config: fields of http_forwarder (indented by four spaces) and
// top-level sections after them (not indented).
func fullStream(brokers, topic, dsn, platformURL, mapping, extra string) string {
	return fmt.Sprintf(`
http:
  enabled: false
input:
  broker:
    inputs:
      - kafka_franz:
          seed_brokers: [ %[1]q ]
          topics: [ %[2]q ]
          consumer_group: %[2]q
          commit_period: 100ms
        processors:
          - outbox:
              dsn: %[3]q
              api_types:
                %[2]s: VEHICLE_EVENT
              emit: none
      - outbox_retry:
          dsn: %[3]q
          lease: 30s
pipeline:
  processors:
    - mapping: %[6]q
output:
  http_forwarder:
    dsn: %[3]q
    url: %[4]q
    access_name: stream-user
    access_pwd: stream-pwd
    timeout: 5s
%[5]s
metrics:
  none: {}
shutdown_timeout: 20s
`, brokers, topic, dsn, platformURL+"/mch/business", extra, mapping)
}

// passThrough is the mapping that sends each message as it came.
const passThrough = "root = this"

// TestTwoStreamsTwoDatabases runs two complete forwarder streams in one
// process, each with its own topic, database and platform. The dispatch
// components of a stream find each other per stream and per database, so
// neither stream ever claims, hands over or records a row of the other:
// each platform receives exactly its own stream's messages, once, and each
// database holds only its own rows, all delivered.
func TestTwoStreamsTwoDatabases(t *testing.T) {
	t.Parallel()
	const perStream = 400
	names := []string{"stream-a", "stream-b"}
	kc := kafkatest.New(t, []kafkatest.Topic{{Name: names[0], Partitions: 2}, {Name: names[1], Partitions: 2}})

	type side struct {
		platform *platformLog
		dsn      string
		pool     *pgxpool.Pool
		logs     *logbuf.Buffer
	}
	sides := make([]side, len(names))
	ctx := context.Background()
	for i, name := range names {
		p, url := newPlatformLog(t)
		dsn, pool := pgtest.NewDBPool(t)
		sides[i] = side{platform: p, dsn: dsn, pool: pool, logs: &logbuf.Buffer{}}
		startStream(t, sides[i].logs, slog.LevelInfo, fullStream(kc.Brokers(), name, sides[i].dsn, url, passThrough, ""))
	}
	for _, name := range names {
		kc.ProduceN(t, name, perStream, func(i int) *kgo.Record {
			return &kgo.Record{Value: vehicle(fmt.Sprintf("%s-%04d", name, i))}
		})
	}

	for i, name := range names {
		pool := sides[i].pool
		waitFor(t, name+" rows delivered", func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'`).Scan(&n)
			return err == nil && n == perStream
		})
		var total, foreign int
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE message_key NOT LIKE $1)
			FROM forward_records`, name+"-%").Scan(&total, &foreign); err != nil {
			t.Fatal(err)
		}
		if total != perStream || foreign != 0 {
			t.Errorf("%s database: %d rows, %d of another stream; want %d and 0", name, total, foreign, perStream)
		}
	}
	// Requests are counted after their rows are SUCCESS, so none is still
	// on its way.
	for i, name := range names {
		got := sides[i].platform.snapshot()
		if len(got) != perStream {
			t.Errorf("%s platform received %d distinct messages, want %d", name, len(got), perStream)
		}
		for id, n := range got {
			if len(id) < len(name) || id[:len(name)] != name {
				t.Errorf("%s platform received %q of another stream", name, id)
			}
			if n != 1 {
				t.Errorf("%s platform received %q %d times", name, id, n)
			}
		}
	}
}
