package console

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

// TestServerErrorsGoToTheLogger: net/http's own messages (here a handler's
// panic) are lines of the console's log, in its format and at error
// level, not lines of the standard logger on stderr.
func TestServerErrorsGoToTheLogger(t *testing.T) {
	t.Parallel()
	var logged logbuf.Buffer
	s, err := New(Config{Addr: "127.0.0.1:0", Operator: "x", Logger: slog.New(slog.NewJSONHandler(&logged, nil))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.mux.HandleFunc("GET /panics", func(http.ResponseWriter, *http.Request) { panic("a handler's bug") })
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if resp, err := http.Get("http://" + <-addr + "/panics"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /panics answered %s, want the connection closed by the panic", resp.Status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logged.String(), "panic serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the panic is not in the console's log; log: %q", logged.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, line := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not the console's format: %v", line, err)
		}
		if strings.Contains(rec.Msg, "panic serving") && rec.Level != "ERROR" {
			t.Errorf("the panic is logged at %s, want ERROR", rec.Level)
		}
	}
}
