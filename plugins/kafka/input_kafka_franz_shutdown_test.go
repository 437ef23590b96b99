package kafka

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

// TestInputShutdownSaysWhatItWaitsFor: once the engine stops reading (the
// reader's context ends), the input logs how many records it handed out
// are still unacknowledged (the engine waits for them before it closes
// the input), and at Close that it commits and leaves the group, with the
// time it may take.
func TestInputShutdownSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	const topic, group = "shutdown", "g-shutdown"
	c := kafkatest.New(t, []kafkatest.Topic{{Name: topic, Partitions: 1}})
	c.ProduceN(t, topic, 7, nil)

	var logs logbuf.Buffer
	res := service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, nil)))))
	f := newInput(t, inputConf(c, topic, group, "checkpoint_limit: 1024"), res)
	ctx := context.Background()
	if err := f.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	acks := readN(t, f, 7)
	if strings.Contains(logs.String(), "Shutting down") {
		t.Fatalf("shutdown reported while reading:\n%s", logs.String())
	}

	stopped, stop := context.WithCancel(ctx)
	stop()
	if _, _, err := f.ReadBatch(stopped); err == nil {
		t.Fatal("ReadBatch with a cancelled context returned no error")
	}
	want := `Shutting down: waiting for kafka_franz: 7 records read from Kafka to be persisted (acknowledged) before the final commit of group \"g-shutdown\"`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("the log does not say what shutdown waits for (want %s):\n%s", want, logs.String())
	}
	for _, ack := range acks {
		_ = ack(ctx, nil)
	}
	if n := f.unacked.Load(); n != 0 {
		t.Errorf("%d records counted unacknowledged after every ack", n)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `committing the final offsets of group \"g-shutdown\" and leaving it (waiting at most 10s for the brokers)`) {
		t.Errorf("Close does not say it commits and leaves the group:\n%s", logs.String())
	}

	// A Close given less time (a stop while starting waits at most 5 s)
	// says so.
	var shortLogs logbuf.Buffer
	res = service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&shortLogs, nil)))))
	f = newInput(t, inputConf(c, topic, group+"-short", ""), res)
	if err := f.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := f.Close(short); err != nil {
		t.Fatal(err)
	}
	// What is left of the 3 s when Close starts: a little less on a
	// loaded machine, never the 10 s of its own timeout.
	m := regexp.MustCompile(`leaving it \(waiting at most (\S+) for the brokers\)`).FindStringSubmatch(shortLogs.String())
	if m == nil {
		t.Fatalf("Close within 3 s does not say how long it waits:\n%s", shortLogs.String())
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d <= 0 || d > 3*time.Second {
		t.Errorf("Close within 3 s says it waits at most %s, want what is left of the 3 s:\n%s", m[1], shortLogs.String())
	}
}
