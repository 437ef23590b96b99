package kafkatest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestEndOffsetsFailsForATopicItCannotRead: the end offsets of a topic the
// broker does not have fail the test that asks, saying which topic, rather
// than reading as an offset.
func TestEndOffsetsFailsForATopicItCannotRead(t *testing.T) {
	c := New(t, []Topic{{Name: "there", Partitions: 1}})
	if ends := c.EndOffsets(t, "there"); len(ends) != 1 || ends[0] != 0 {
		t.Fatalf("end offsets of an empty one-partition topic: %v, want partition 0 at 0", ends)
	}
	rec := &fatalRecorder{TB: t}
	done := make(chan map[int32]int64)
	go func() {
		defer close(done)
		done <- c.EndOffsets(rec, "not-there")
	}()
	if ends, returned := <-done; returned {
		t.Fatalf("EndOffsets of a missing topic returned %v", ends)
	}
	if !strings.Contains(rec.msg, `"not-there"`) {
		t.Errorf("EndOffsets of a missing topic failed with %q, want the topic named", rec.msg)
	}
}

// fatalRecorder is the test it wraps, but for Fatalf, which it records
// before ending the goroutine as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
