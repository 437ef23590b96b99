// Package logbuf collects the log output of concurrent goroutines (a
// stream's components, a child process) for a test to read while they
// write.
package logbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use. The zero value is empty
// and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines are the lines written so far, without the final newline.
func (b *Buffer) Lines() []string {
	s := strings.TrimSuffix(b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// Count is the number of times substr was written.
func (b *Buffer) Count(substr string) int { return strings.Count(b.String(), substr) }
