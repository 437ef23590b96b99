package lograte

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

func TestBurst(t *testing.T) {
	out := &logbuf.Buffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(out, nil)))
	b := New(log, time.Minute)
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }

	for i := range 1000 {
		b.Warn("lease", "row "+string(rune('a'+i%26))+" given back")
	}
	b.Warn("other", "another kind")
	if lines := out.Lines(); len(lines) != 2 {
		t.Fatalf("1000 warnings of one kind and one of another logged %d lines, want 2:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	now = now.Add(2 * time.Minute)
	b.Warn("lease", "row z given back")
	lines := out.Lines()
	if len(lines) != 4 || !strings.Contains(lines[2], "999 more like it") {
		t.Fatalf("after the window: %q, want the count of the 999 held back, then the new one", lines)
	}
	b.Warn("lease", "row y given back")
	b.Flush()
	if lines := out.Lines(); len(lines) != 5 || !strings.Contains(lines[4], "1 more like it, the last: row y given back") {
		t.Fatalf("Flush: %q", lines)
	}
}
