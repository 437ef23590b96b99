package devstack

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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

// markStart creates or upgrades the schema and marks where this run's rows
// start: progress counts the rows after the mark, and Leftover the rows
// before it still to send. The forwarder migrates on start too; doing it
// first lets the stack read the tables from its first progress line. Both
// may run at once.
func (s *Stack) markStart(ctx context.Context) error {
	if _, err := outboxdb.Migrate(ctx, s.pool); err != nil {
		return err
	}
	var err error
	if s.mark, err = outboxdb.MaxRecordID(ctx, s.pool); err != nil {
		return err
	}
	s.Leftover, err = outboxdb.UnsentUpTo(ctx, s.pool, s.mark)
	return err
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

// Drain waits, for at most within, until the stack's consumer group has
// committed every record of the topics the generator writes (its lag is 0),
// says whether it has, and reads the Progress then. With the generator
// stopped first, a forwarder stopped after a drain leaves nothing unread in
// the dev broker, which keeps nothing between runs. A count of this run's
// rows would not tell: the broker's offsets start at 0 each run while the
// database stays, and a message with the bytes and the Kafka coordinates of
// an earlier run's row (an empty one, a tombstone) is taken for a
// redelivery of it and makes no row.
func (s *Stack) Drain(ctx context.Context, within time.Duration) (Progress, bool) {
	wctx, cancel := context.WithTimeout(ctx, within)
	drained := s.waitForNoLag(wctx)
	cancel()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	p, _ := s.Progress(rctx)
	return p, drained
}

// waitForNoLag waits until the stack's consumer group has committed the end
// of every partition of the generator's topics, and says whether it has
// before ctx ended.
func (s *Stack) waitForNoLag(ctx context.Context) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		return false
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if lags, err := adm.Lag(ctx, Group); err == nil && caughtUp(lags[Group]) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// caughtUp: the group has committed the end offset of every partition of
// the generator's topics (one it never committed counts from the log start).
func caughtUp(g kadm.DescribedGroupLag) bool {
	if g.Error() != nil {
		return false
	}
	for _, topic := range []string{eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic} {
		parts, ok := g.Lag[topic]
		if !ok {
			return false
		}
		for _, m := range parts {
			if m.Err != nil || m.Lag != 0 {
				return false
			}
		}
	}
	return true
}

// headerEvery is how many progress lines go by before the header is
// printed again, so that one is always on a terminal's screen.
const headerEvery = 20

// Run prints a progress line every second to w until ctx ends or, when
// d > 0, for d, with a header first and every headerEvery lines, and the
// events of the stack's forwarders (mapping reloads, Kafka rebalances) as
// they come. It returns nil then, or as soon as a write to w fails (its
// reader is gone: `make run | head`), and an error if the stack's
// forwarder exits by itself. It does not stop the stack.
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
	// printed writes a line and says whether it could: a failed write means
	// nobody reads the progress any more, and the stack stops as on Ctrl-C.
	printed := func(format string, args ...any) bool {
		_, err := fmt.Fprintf(w, format+"\n", args...)
		return err == nil
	}
	if !printed("%s", FormatHeader()) {
		return nil
	}
	lines := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			return nil
		case <-fwdDone:
			return fmt.Errorf("the forwarder stopped on its own (%v); last lines of %s:\n%s",
				s.Forwarder.Err(), s.LogPath, childproc.TailFile(s.LogPath, 3000))
		case e := <-s.events:
			if !printed("%s  %s", clock(e.At.Sub(start)), e.Text) {
				return nil
			}
		case now := <-tick.C:
			qctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
			p, err := s.Progress(qctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if !printed("%s  database: %v", clock(now.Sub(start)), err) {
					return nil
				}
				continue
			}
			if lines > 0 && lines%headerEvery == 0 && !printed("%s", FormatHeader()) {
				return nil
			}
			lines++
			if !printed("%s", FormatLine(now.Sub(start), p, last, now.Sub(lastAt))) {
				return nil
			}
			last, lastAt = p, now
		}
	}
}

// The progress columns: each value is right-aligned under the end of its
// header, one space apart, and a line fits 80 columns (docs/operations.md
// explains them).
var progressColumns = []struct {
	header string
	width  int
}{
	{"time", 8}, {"produced", 8}, {"persisted", 9}, {"delivered", 9}, {"retrying", 8},
	{"failed", 6}, {"bad", 5}, {"backlog", 7}, {"msg/s", 5}, {"p.errs", 6},
}

// FormatHeader is the header of the progress lines.
func FormatHeader() string {
	cells := make([]string, len(progressColumns))
	for i, c := range progressColumns {
		if i == 0 {
			cells[i] = fmt.Sprintf("%-*s", c.width, c.header)
			continue
		}
		cells[i] = fmt.Sprintf("%*s", c.width, c.header)
	}
	return strings.Join(cells, " ")
}

// FormatLine is one progress line: p, with rates since prev, taken dt ago.
func FormatLine(elapsed time.Duration, p, prev Progress, dt time.Duration) string {
	rate := 0.0
	if dt > 0 {
		rate = float64(p.Rows.Delivered-prev.Rows.Delivered) / dt.Seconds()
	}
	pl := p.Platform
	values := []string{
		clock(elapsed),
		strconv.FormatInt(p.Produced.Produced, 10),
		strconv.FormatInt(p.Rows.Persisted, 10),
		strconv.FormatInt(p.Rows.Delivered, 10),
		strconv.FormatInt(p.Rows.Retrying, 10),
		strconv.FormatInt(p.Rows.Failed, 10),
		strconv.FormatInt(p.Produced.Malformed, 10),
		strconv.FormatInt(p.Rows.Waiting+p.Rows.InProgress, 10),
		strconv.FormatFloat(rate, 'f', 0, 64),
		strconv.FormatInt(pl.Errcode998+pl.Errcode999+pl.HTTP5xx+pl.Unavailable+pl.AuthFailures+pl.BadRequests, 10),
	}
	cells := make([]string, len(values))
	for i, v := range values {
		cells[i] = fmt.Sprintf("%*s", progressColumns[i].width, v)
	}
	return strings.Join(cells, " ")
}

func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
}
