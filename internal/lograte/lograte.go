// Package lograte turns bursts of alike warnings into one log line each: the
// first of a kind is logged at once, and the others of the same kind within
// the window are counted and summed up in one line when it closes. A
// backlog that fails row by row then costs a few lines, not one per row.
package lograte

import (
	"strconv"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Burst rate-limits warnings by kind.
type Burst struct {
	log    *service.Logger
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*burst
}

type burst struct {
	until   time.Time
	more    int
	example string
}

// New returns a Burst logging to log, with one line per kind per window.
func New(log *service.Logger, window time.Duration) *Burst {
	return &Burst{log: log, window: window, now: time.Now, kinds: map[string]*burst{}}
}

// Warn logs msg at WARN level unless a warning of the same kind was logged
// within the window; then it is counted, and the count is logged with the
// latest message when the window ends (on the next warning of that kind, or
// by Flush).
func (b *Burst) Warn(kind, msg string) {
	b.mu.Lock()
	now := b.now()
	k := b.kinds[kind]
	if k != nil && now.Before(k.until) {
		k.more++
		k.example = msg
		b.mu.Unlock()
		return
	}
	var summary string
	if k != nil && k.more > 0 {
		summary = k.summary()
	}
	b.kinds[kind] = &burst{until: now.Add(b.window)}
	b.mu.Unlock()
	if summary != "" {
		b.log.Warn(summary)
	}
	b.log.Warn(msg)
}

// Flush logs the counts of the windows still open.
func (b *Burst) Flush() {
	b.mu.Lock()
	var lines []string
	for kind, k := range b.kinds {
		if k.more > 0 {
			lines = append(lines, k.summary())
		}
		delete(b.kinds, kind)
	}
	b.mu.Unlock()
	for _, l := range lines {
		b.log.Warn(l)
	}
}

func (k *burst) summary() string {
	return "… and " + strconv.Itoa(k.more) + " more like it, the last: " + k.example
}
