package integration_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

// startStream builds a stream of conf, logging to logs at level, and runs
// it. stop stops it and returns what Run returned (context.Canceled counts
// as a clean end); it runs once, at the latest when the test ends, which
// then prints the logs if the test failed.
func startStream(t *testing.T, logs *logbuf.Buffer, level slog.Level, conf string) (stop func() error) {
	t.Helper()
	sb := service.NewStreamBuilder()
	sb.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level})))
	if err := sb.SetYAML(conf); err != nil {
		t.Fatalf("config: %v\n%s", err, conf)
	}
	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- stream.Run(context.Background()) }()
	stop = sync.OnceValue(func() error {
		if err := stream.StopWithin(30 * time.Second); err != nil {
			return err
		}
		if err := <-done; err != nil && err != context.Canceled {
			return err
		}
		return nil
	})
	t.Cleanup(func() {
		_ = stop()
		if t.Failed() {
			t.Logf("stream logs:\n%s", logs.String())
		}
	})
	return stop
}
