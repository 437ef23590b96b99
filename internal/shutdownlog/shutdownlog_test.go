package shutdownlog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWatch(t *testing.T) {
	t.Parallel()
	var out syncBuffer
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&out, nil)))
	var left atomic.Int64
	left.Store(3)
	w := New(log, 10*time.Millisecond, func() string {
		if n := left.Load(); n > 0 {
			return fmt.Sprintf("%d rows in flight", n)
		}
		return ""
	})
	w.Start()
	w.Start() // once
	if got := out.String(); strings.Count(got, "Shutting down: waiting for 3 rows in flight") != 1 {
		t.Fatalf("Start logged %q, want what it waits for, once", got)
	}
	for !strings.Contains(out.String(), "still waiting, after") {
		time.Sleep(5 * time.Millisecond)
	}
	left.Store(0)
	time.Sleep(50 * time.Millisecond)
	n := strings.Count(out.String(), "\n")
	time.Sleep(50 * time.Millisecond)
	if strings.Count(out.String(), "\n") != n {
		t.Errorf("still logging once nothing is awaited:\n%s", out.String())
	}
	w.Stop()
	w.Stop()

	// Nothing awaited: nothing logged. Stopped first: Start does nothing.
	var quiet syncBuffer
	qlog := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&quiet, nil)))
	idle := New(qlog, time.Millisecond, func() string { return "" })
	idle.Start()
	idle.Stop()
	early := New(qlog, time.Millisecond, func() string { return "something" })
	early.Stop()
	early.Start()
	if quiet.String() != "" {
		t.Errorf("logged %q with nothing awaited or after Stop", quiet.String())
	}
}
