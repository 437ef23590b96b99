package devstack

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Progress is a snapshot of the stack: what the generator produced, where
// this run's rows are in the database, and what the platform saw.
type Progress struct {
	// Produced is what Kafka acknowledged from the generator.
	Produced eventgen.Stats
	// Rows are this run's rows by state.
	Rows outboxdb.Progress
	// Platform are the mock platform's counters.
	Platform mockplatform.Stats
}

// Progress reads a snapshot.
func (s *Stack) Progress(ctx context.Context) (Progress, error) {
	var p Progress
	if s.Generator != nil {
		p.Produced = s.Generator.Stats()
	}
	p.Platform = s.Platform.Stats()
	var err error
	p.Rows, err = outboxdb.ReadProgress(ctx, s.pool, s.mark)
	return p, err
}

// Run prints a progress line every second to w until ctx ends or, when
// d > 0, for d. It returns nil then, and an error if the stack's forwarder
// exits by itself. It does not stop the stack.
func (s *Stack) Run(ctx context.Context, d time.Duration, w io.Writer) error {
	start := time.Now()
	var deadline <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		deadline = t.C
	}
	var fwdDone <-chan struct{}
	if s.Forwarder != nil {
		fwdDone = s.Forwarder.Done()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last Progress
	lastAt := start
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			return nil
		case <-fwdDone:
			return fmt.Errorf("the forwarder stopped on its own (%v); last lines of %s:\n%s",
				s.Forwarder.Err(), s.LogPath, childproc.TailFile(s.LogPath, 3000))
		case now := <-tick.C:
			qctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
			p, err := s.Progress(qctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				fmt.Fprintf(w, "%s  database: %v\n", clock(now.Sub(start)), err)
				continue
			}
			fmt.Fprintln(w, FormatLine(now.Sub(start), p, last, now.Sub(lastAt)))
			last, lastAt = p, now
		}
	}
}

// FormatLine is one progress line: p, with rates since prev, taken dt ago.
func FormatLine(elapsed time.Duration, p, prev Progress, dt time.Duration) string {
	rate := 0.0
	if dt > 0 {
		rate = float64(p.Rows.Delivered-prev.Rows.Delivered) / dt.Seconds()
	}
	pl := p.Platform
	return fmt.Sprintf("%s  produced %d  persisted %d  delivered %d  retrying %d  failed %d (%d malformed sent)  in flight %d  | %.0f msg/s | platform: %d accepted, %d dup, %d errors, peak %d concurrent",
		clock(elapsed), p.Produced.Produced, p.Rows.Persisted, p.Rows.Delivered,
		p.Rows.Retrying, p.Rows.Failed, p.Produced.Malformed, p.Rows.Waiting+p.Rows.InProgress, rate,
		pl.Accepted, pl.Duplicates, pl.Errcode998+pl.Errcode999+pl.HTTP5xx+pl.Unavailable+pl.AuthFailures+pl.BadRequests,
		pl.PeakInFlight)
}

func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
}
