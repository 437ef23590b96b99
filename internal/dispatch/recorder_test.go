package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// fakeWrites stands in for the result statement: it records each call and
// writes every result except the ids in lost.
type fakeWrites struct {
	mu    sync.Mutex
	calls [][]int64
	gate  chan struct{} // when set, each write waits for a value
	lost  map[int64]bool
	err   error
	// failures is how many writes fail with err before writes succeed
	// (0: every write fails with err, when err is set).
	failures int
}

// writes is how many writes were made so far: a write may still be under
// way when its caller has stopped waiting (its context ended), so the test
// reads the count under the lock.
func (f *fakeWrites) writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeWrites) write(_ context.Context, results []outboxdb.Result) ([]int64, error) {
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]int64, 0, len(results))
	var call []int64
	for _, r := range results {
		call = append(call, r.ID)
		if !f.lost[r.ID] {
			ids = append(ids, r.ID)
		}
	}
	f.calls = append(f.calls, call)
	if f.err != nil && (f.failures == 0 || len(f.calls) <= f.failures) {
		return nil, f.err
	}
	return ids, nil
}

func results(ids ...int64) []outboxdb.Result {
	out := make([]outboxdb.Result, len(ids))
	for i, id := range ids {
		out[i] = outboxdb.Result{ID: id, Status: outboxdb.StatusSuccess}
	}
	return out
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ResultsFinishedDuringAWriteGoInTheNextOne", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{gate: make(chan struct{})}
		r := NewRecorder(f.write, 1000)
		var wg sync.WaitGroup
		record := func(ids ...int64) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := r.Record(ctx, results(ids...))
				if err != nil || len(got) != len(ids) {
					t.Errorf("Record(%v) = %v, %v", ids, got, err)
				}
			}()
		}
		record(1)
		// The first write is under way (blocked on the gate) when 50 more
		// batches finish.
		deadline := time.Now().Add(5 * time.Second)
		for {
			r.mu.Lock()
			writing := r.writing && len(r.queue) == 0
			r.mu.Unlock()
			if writing || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		for i := int64(2); i <= 51; i++ {
			record(i*10, i*10+1)
		}
		for {
			r.mu.Lock()
			queued := len(r.queue)
			r.mu.Unlock()
			if queued == 50 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		close(f.gate)
		wg.Wait()
		if len(f.calls) != 2 || len(f.calls[0]) != 1 || len(f.calls[1]) != 100 {
			t.Fatalf("statements %d (sizes %v), want 2: the lone first result, then the 50 batches together", len(f.calls), sizes(f.calls))
		}
	})

	t.Run("AStatementHoldsEachRowOnceAndAtMostMaxRows", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{}
		r := NewRecorder(f.write, 3)
		r.mu.Lock() // queue them all before the writer runs
		r.writing = true
		var calls []*recordCall
		for _, ids := range [][]int64{{1, 2}, {1}, {3}, {4, 5}} {
			c := &recordCall{ctx: ctx, results: results(ids...), done: make(chan struct{})}
			r.queue = append(r.queue, c)
			calls = append(calls, c)
		}
		r.mu.Unlock()
		r.drain()
		for _, c := range calls {
			<-c.done
		}
		// {1,2}+{3} fit in 3 rows; the second result of row 1 and {4,5}
		// follow in the next.
		want := [][]int64{{1, 2, 3}, {1, 4, 5}}
		if len(f.calls) != len(want) {
			t.Fatalf("statements %v, want %v", f.calls, want)
		}
		for i := range want {
			if len(f.calls[i]) != len(want[i]) {
				t.Fatalf("statements %v, want %v", f.calls, want)
			}
		}
	})

	t.Run("EachCallerLearnsItsOwnWrittenRows", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{lost: map[int64]bool{2: true}}
		r := NewRecorder(f.write, 100)
		got, err := r.Record(ctx, results(1, 2, 3))
		if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 3 {
			t.Fatalf("Record = %v, %v; want rows 1 and 3 (row 2's claim was lost)", got, err)
		}
	})

	t.Run("AFailedWriteFailsItsCallers", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("connection reset")
		f := &fakeWrites{err: boom}
		r := NewRecorder(f.write, 100)
		if _, err := r.Record(ctx, results(1)); !errors.Is(err, boom) {
			t.Fatalf("error %v, want the write's", err)
		}
	})

	t.Run("ClosedRefuses", func(t *testing.T) {
		t.Parallel()
		r := NewRecorder((&fakeWrites{}).write, 100)
		r.Close()
		if _, err := r.Record(ctx, results(1)); !errors.Is(err, ErrRecorderClosed) {
			t.Fatalf("error %v, want ErrRecorderClosed", err)
		}
	})
}

func sizes(calls [][]int64) []int {
	out := make([]int, len(calls))
	for i, c := range calls {
		out[i] = len(c)
	}
	return out
}

// TestRecordDurably: the results of requests that were made are written
// even when the caller is stopping, and a failed write is retried while
// their claims hold, then given up.
func TestRecordDurably(t *testing.T) {
	t.Parallel()
	down := errors.New("connection refused")
	newRecorder := func(f *fakeWrites) (*Recorder, *[]error) {
		r := NewRecorder(f.write, 1000)
		r.pause = func(int) time.Duration { return time.Millisecond }
		var warned []error
		r.OnRetry = func(n int, err error) { warned = append(warned, err) }
		return r, &warned
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	t.Run("RetriedUntilWrittenEvenWhenStopping", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{err: down, failures: 2}
		r, warned := newRecorder(f)
		ids, err := r.RecordDurably(cancelled, results(1, 2), time.Time{})
		if err != nil || len(ids) != 2 || f.writes() != 3 {
			t.Fatalf("ids %v, err %v after %d writes; want both written at the third", ids, err, f.writes())
		}
		if len(*warned) != 1 {
			t.Fatalf("warned %d times, want once", len(*warned))
		}
	})
	t.Run("GivenUpWhenTheClaimsEnd", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{err: down}
		r, _ := newRecorder(f)
		claimsEnd := time.Now().Add(100 * time.Millisecond)
		ids, err := r.RecordDurably(cancelled, results(1), claimsEnd)
		if !errors.Is(err, down) || ids != nil || f.writes() < 2 {
			t.Fatalf("ids %v, err %v after %d writes; want the write's error after retries", ids, err, f.writes())
		}
		if late := time.Since(claimsEnd); late > durableTimeout/2 {
			t.Fatalf("gave up %v after the claims ended: the claims' end must bound the retries", late)
		}
	})
	t.Run("AClaimEndedAlreadyDoesNotStopTheFirstWrite", func(t *testing.T) {
		t.Parallel()
		f := &fakeWrites{}
		r, _ := newRecorder(f)
		if ids, err := r.RecordDurably(context.Background(), results(1), time.Now().Add(-time.Second)); err != nil || len(ids) != 1 {
			t.Fatalf("ids %v, err %v; want the row written (the fence decides, not the local clock)", ids, err)
		}
	})
	t.Run("ClosedIsNotRetried", func(t *testing.T) {
		t.Parallel()
		r, warned := newRecorder(&fakeWrites{})
		r.Close()
		if _, err := r.RecordDurably(context.Background(), results(1), time.Time{}); !errors.Is(err, ErrRecorderClosed) || len(*warned) != 0 {
			t.Fatalf("err %v, warned %d; want ErrRecorderClosed at once", err, len(*warned))
		}
	})
}
