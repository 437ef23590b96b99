package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/launch"
)

// launchGrace is how long after the stream has started the first row is
// claimed: Benthos installs its SIGTERM handler a few statements after it
// reports the start, on the same goroutine.
const launchGrace = 100 * time.Millisecond

// abandonTimeout bounds what an exit while starting waits for: the Kafka
// input's final commit and its leaving the group (launch.Gate.Abandon), so
// that the partitions move on at once rather than after session_timeout.
const abandonTimeout = 5 * time.Second

// abandonBound is how long an exit while starting may wait: abandonTimeout,
// or SHUTDOWN_TIMEOUT (the shipped pipeline's shutdown_timeout) when that is
// shorter, so that the process never takes longer to exit than the operator
// allowed its graceful stop (0: it exits at once, leaving the group to
// expire).
func abandonBound(getenv func(string) string) time.Duration {
	if d, err := time.ParseDuration(getenv("SHUTDOWN_TIMEOUT")); err == nil && d >= 0 && d < abandonTimeout {
		return d
	}
	return abandonTimeout
}

// earlySignals ends the process while it starts. Benthos listens for
// SIGTERM and SIGINT only once the stream is built, and until then Go's
// default action would kill the process by signal. Nothing is claimed
// before then (launch.Process), so a signal that arrives first shuts the
// gate for good and the process exits 0 holding nothing: its inserts are
// committed or rolled back, its uncommitted Kafka records are read again
// and deduplicated by key, and its consumer group is left.
var earlySignals struct {
	once sync.Once
	stop func()
}

// catchEarlySignals starts catching, for a command that runs a stream.
func catchEarlySignals() {
	earlySignals.once.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		done := make(chan struct{})
		go func() {
			select {
			case sig := <-ch:
				if launch.Process.Cancel() {
					fmt.Fprintf(os.Stderr, "forwarder: %v while starting, before any outbox row was claimed; exiting\n", sig)
					ctx, cancel := context.WithTimeout(context.Background(), abandonBound(os.Getenv))
					launch.Process.Abandon(ctx)
					cancel()
					os.Exit(0)
				}
			case <-done:
			}
		}()
		earlySignals.stop = func() {
			signal.Stop(ch)
			close(done)
		}
	})
}

// onStreamStart opens launch.Process once Benthos listens for signals, and
// leaves them to Benthos from then on.
func onStreamStart(*service.RunningStreamSummary) error {
	time.AfterFunc(launchGrace, func() {
		if launch.Process.Open() && earlySignals.stop != nil {
			earlySignals.stop()
		}
	})
	return nil
}
