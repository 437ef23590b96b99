package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Recorder writes the results of many output batches in few statements:
// while one write is under way, the results that finish meanwhile wait, and
// the next write takes them all (group commit). Nothing waits on purpose, so
// a lone result is written at once, and under load the statements grow
// instead of multiplying.
//
// A write that fails fails every result it carried; RecordDurably retries
// it (the write is fenced and idempotent).
type Recorder struct {
	write func(ctx context.Context, results []outboxdb.Result) ([]int64, error)
	// maxRows caps one statement.
	maxRows int
	// OnRetry, when set, is called when a RecordDurably's first write
	// fails, with the results it carries and the error (for the log).
	OnRetry func(results int, err error)
	// pause is the wait before retry number try+1 (tests shorten it).
	pause func(try int) time.Duration

	mu      sync.Mutex
	queue   []*recordCall
	writing bool
	closed  bool
}

type recordCall struct {
	ctx     context.Context
	results []outboxdb.Result
	done    chan struct{}
	ids     []int64
	err     error
}

const (
	// statementTimeout bounds one write of a group.
	statementTimeout = 15 * time.Second
	// durableTimeout bounds the retries of one RecordDurably, which stop
	// earlier when a claim of its results ends first (past it the write
	// could no longer match).
	durableTimeout = 15 * time.Second
	// retryPauseMax caps the pause between two tries of RecordDurably.
	retryPauseMax = 2 * time.Second
)

func retryPause(try int) time.Duration {
	return min(time.Duration(try)*200*time.Millisecond, retryPauseMax)
}

// ErrRecorderClosed is returned by Record after Close.
var ErrRecorderClosed = errors.New("the result writer is closed")

// NewRecorder returns a Recorder writing with write (outboxdb.RecordResults
// on a pool), at most maxRows results per statement.
func NewRecorder(write func(ctx context.Context, results []outboxdb.Result) ([]int64, error), maxRows int) *Recorder {
	return &Recorder{write: write, maxRows: max(maxRows, 1), pause: retryPause}
}

// RecordDurably is Record for results whose requests were made: they must
// be recorded, or the platform gets the messages again. It runs even when
// ctx is cancelled (a stopping output still records what it sent), and
// retries a failed write while the claims hold: until claimsEnd (the
// earliest lease end of the results' claims, zero when their leases are
// renewed), and for at most durableTimeout. A result given up on while
// the database is briefly away means the platform gets the message again.
func (r *Recorder) RecordDurably(ctx context.Context, results []outboxdb.Result, claimsEnd time.Time) ([]int64, error) {
	deadline := time.Now().Add(durableTimeout)
	if claimsEnd.After(time.Now()) && claimsEnd.Before(deadline) {
		deadline = claimsEnd
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	var failed error // the last write's error, rather than the deadline's
	for try := 1; ; try++ {
		ids, err := r.Record(rctx, results)
		switch {
		case err == nil, errors.Is(err, ErrRecorderClosed):
			return ids, err
		case rctx.Err() == nil || failed == nil:
			failed = err
		}
		if try == 1 && r.OnRetry != nil {
			r.OnRetry(len(results), err)
		}
		t := time.NewTimer(r.pause(try))
		select {
		case <-t.C:
		case <-rctx.Done():
			t.Stop()
			return nil, failed
		}
	}
}

// Record writes results, together with those of concurrent callers, and
// returns the ids written (see outboxdb.RecordResults). ctx bounds this
// caller's wait; the statement itself is bounded by statementTimeout, since
// it carries other callers' results too.
func (r *Recorder) Record(ctx context.Context, results []outboxdb.Result) ([]int64, error) {
	if len(results) == 0 {
		return nil, nil
	}
	c := &recordCall{ctx: ctx, results: results, done: make(chan struct{})}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrRecorderClosed
	}
	r.queue = append(r.queue, c)
	if !r.writing {
		r.writing = true
		go r.drain()
	}
	r.mu.Unlock()
	select {
	case <-c.done:
		return c.ids, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// drain writes groups until nothing waits.
func (r *Recorder) drain() {
	for {
		r.mu.Lock()
		group := r.takeLocked()
		if len(group) == 0 {
			r.writing = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.writeGroup(group)
	}
}

// takeLocked takes the next group: whole calls, up to maxRows results (at
// least one call), and never one row twice (a row claimed again after its
// lease ran out may have a result from each claim; each goes in its own
// statement, where the fence keeps the current one).
func (r *Recorder) takeLocked() []*recordCall {
	var (
		group []*recordCall
		rest  []*recordCall
		rows  int
		seen  = map[int64]bool{}
	)
	for _, c := range r.queue {
		fits := len(group) == 0 || rows+len(c.results) <= r.maxRows
		if fits {
			for _, res := range c.results {
				if seen[res.ID] {
					fits = false
					break
				}
			}
		}
		if !fits {
			rest = append(rest, c)
			continue
		}
		group = append(group, c)
		rows += len(c.results)
		for _, res := range c.results {
			seen[res.ID] = true
		}
	}
	r.queue = rest
	return group
}

func (r *Recorder) writeGroup(group []*recordCall) {
	all := make([]outboxdb.Result, 0, len(group[0].results))
	for _, c := range group {
		all = append(all, c.results...)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(group[0].ctx), statementTimeout)
	defer cancel()
	ids, err := r.write(ctx, all)
	written := make(map[int64]bool, len(ids))
	for _, id := range ids {
		written[id] = true
	}
	for _, c := range group {
		c.err = err
		if err == nil {
			for _, res := range c.results {
				if written[res.ID] {
					c.ids = append(c.ids, res.ID)
				}
			}
		}
		close(c.done)
	}
}

// Close refuses further results; writes under way finish.
func (r *Recorder) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}
