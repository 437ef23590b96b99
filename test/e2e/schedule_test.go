package e2e_test

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The scenarios run in parallel. Each owns its database, Kafka cluster,
// mock platform, consumer group and ports, so they are independent of each
// other; what they share is the machine, and CI has two cores. A scenario
// that keeps the CPU busy for long (tens of thousands of messages, several
// instances, crashes and restarts, its own PostgreSQL server crashed or
// failed over) runs in the heavy lane, two at a time, or alone there when
// its checks leave a loaded CPU little room (a request timeout a few
// hundred milliseconds above the platform's latency, a bound on resident
// memory); the others, which mostly wait (on the platform's latency, a
// lease, a pause, a process starting or stopping), in the light lane, two
// at a time. A scenario whose promise is about every instance following the
// shared platform state within a second (a Retry-After pause, the open
// breaker and the ramp after it, the global rate limit) runs with nothing
// beside it: next to others on a loaded machine, instances read that state
// seconds late and the checks failed (requests during a pause, rows left
// unclaimed under the rate limit, deliveries twice after a hang), which a
// run one by one does not show as often. Within a lane the longest start
// first, so that the suite ends sooner, and a scenario that waits for room
// keeps its turn: while it waits, only scenarios whose expects say they
// end before it can start take the room that is free (backfilling, as
// batch schedulers do), which keeps both seats of a lane busy while a
// scenario that needs the whole lane waits for a long one to end.
var (
	heavyLane = &lane{name: "heavy", room: 2}
	lightLane = &lane{name: "light", room: 2}

	heavy = seat{{heavyLane, 1}}
	alone = seat{{heavyLane, heavyLane.room}}
	light = seat{{lightLane, 1}}
	// quiet takes both lanes whole, the heavy one first (always in that
	// order, so that two quiet scenarios cannot each hold one lane).
	quiet = seat{{heavyLane, heavyLane.room}, {lightLane, lightLane.room}}
)

// seat is the room a scenario takes, in one lane or more.
type seat []claim

// claim is room in one lane.
type claim struct {
	lane *lane
	room int
}

// lane runs the scenarios given to it, room at a time.
type lane struct {
	name string
	room int

	mu      sync.Mutex
	used    int
	queued  int
	waiting []*ticket
	// running are the scenarios granted room, until they give it back.
	running []*ticket
}

// ticket is one scenario's place in a lane.
type ticket struct {
	room   int
	expect time.Duration
	seq    int
	// ready is set once the scenario runs (go test released it from
	// t.Parallel): only a running scenario is let in, so that one still
	// held by go test's -parallel limit never keeps room it cannot use.
	ready   bool
	granted chan struct{}
	// ends is when the scenario should end by its expect, once granted.
	ends time.Time
}

// scenario runs t in parallel with the other scenarios once its lanes have
// room for its seat; the room is given back when t and its subtests are
// done. expect is about how long t takes on an idle two-core machine: the
// scheduling order, not a limit.
func scenario(t *testing.T, s seat, expect time.Duration) {
	t.Helper()
	// Queued before t.Parallel: the top-level scenarios all queue while go
	// test runs them up to their t.Parallel, one by one, before any runs.
	tickets := make([]*ticket, len(s))
	for i, c := range s {
		tickets[i] = c.lane.enqueue(c.room, expect)
	}
	t.Parallel()
	for i, c := range s {
		c.lane.wait(tickets[i])
		t.Cleanup(func() { c.lane.release(tickets[i]) })
	}
	started := time.Now()
	t.Cleanup(func() { reportScenario(t.Name(), s, expect, started) })
}

// suiteStart is when the test binary started: the report says when each
// scenario started, counted from it.
var suiteStart = time.Now()

// reportScenario appends how long a scenario ran, against its expect, and
// when it started in the suite to the file E2E_SCHEDULE_REPORT names
// (`make test-e2e` prints the longest): what to look at first to make the
// suite shorter (the one that ends last, started late or ran long), and to
// keep the expects true.
func reportScenario(name string, s seat, expect time.Duration, started time.Time) {
	took := time.Since(started)
	path := os.Getenv("E2E_SCHEDULE_REPORT")
	if path == "" {
		return
	}
	lanes := make([]string, len(s))
	for i, c := range s {
		lanes[i] = fmt.Sprintf("%s×%d", c.lane.name, c.room)
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%6.1fs  expect %4.0fs  from %5.0fs to %5.0fs  %-16s %s\n", took.Seconds(), expect.Seconds(),
		started.Sub(suiteStart).Seconds(), time.Since(suiteStart).Seconds(), strings.Join(lanes, "+"), name)
}

var reportMu sync.Mutex

func (l *lane) enqueue(room int, expect time.Duration) *ticket {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queued++
	tk := &ticket{room: room, expect: expect, seq: l.queued, granted: make(chan struct{})}
	l.waiting = append(l.waiting, tk)
	return tk
}

// laneSettle is how long the lanes let none in after the first scenario
// runs: go test releases every parallel scenario at once, and within that
// moment the longest must not lose their turn to whichever woke first.
// Each marks itself running before it waits for the moment to pass.
const laneSettle = 200 * time.Millisecond

var settleOnce sync.Once

func (l *lane) wait(tk *ticket) {
	l.mu.Lock()
	tk.ready = true
	l.mu.Unlock()
	settleOnce.Do(func() { time.Sleep(laneSettle) })
	l.mu.Lock()
	l.grantLocked()
	l.mu.Unlock()
	<-tk.granted
}

func (l *lane) release(tk *ticket) {
	l.mu.Lock()
	l.used -= tk.room
	l.running = slices.DeleteFunc(l.running, func(r *ticket) bool { return r == tk })
	l.grantLocked()
	l.mu.Unlock()
}

// grantLocked lets the running scenarios in, longest first, as long as the
// next fits. The first that does not fit keeps its turn: those after it
// are let in only when they fit and their expect ends before the time the
// first will have room, by the expects of those running (never, once one
// of those runs past its expect), so that a scenario needing the whole
// lane is not passed over until the end.
func (l *lane) grantLocked() {
	slices.SortFunc(l.waiting, func(a, b *ticket) int {
		return cmp.Or(cmp.Compare(b.expect, a.expect), cmp.Compare(a.seq, b.seq))
	})
	now := time.Now()
	kept := l.waiting[:0]
	var roomAt time.Time // when the first that did not fit will have room
	for _, tk := range l.waiting {
		fits := tk.ready && l.used+tk.room <= l.room
		switch {
		case fits && (roomAt.IsZero() || !now.Add(tk.expect).After(roomAt)):
			l.used += tk.room
			tk.ends = now.Add(tk.expect)
			l.running = append(l.running, tk)
			close(tk.granted)
			continue
		case tk.ready && !fits && roomAt.IsZero():
			roomAt = l.roomAtLocked(tk.room, now)
		}
		kept = append(kept, tk)
	}
	l.waiting = kept
}

// roomAtLocked is when room will be free in the lane, by the expects of the
// scenarios running: now at the earliest.
func (l *lane) roomAtLocked(room int, now time.Time) time.Time {
	running := slices.SortedFunc(slices.Values(l.running), func(a, b *ticket) int { return a.ends.Compare(b.ends) })
	free, at := l.room-l.used, now
	for _, r := range running {
		if free >= room {
			break
		}
		free += r.room
		at = later(at, r.ends)
	}
	return at
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestLaneBackfills: while a scenario that needs the whole lane waits for
// a long one, a scenario that ends before then by its expect takes the free
// seat, one that would not waits, and none is let in once the long one
// runs past its expect.
func TestLaneBackfills(t *testing.T) {
	l := &lane{name: "test", room: 2}
	add := func(room int, expect time.Duration) *ticket {
		tk := l.enqueue(room, expect)
		tk.ready = true
		return tk
	}
	granted := func(tk *ticket) bool {
		select {
		case <-tk.granted:
			return true
		default:
			return false
		}
	}
	grant := func() {
		l.mu.Lock()
		l.grantLocked()
		l.mu.Unlock()
	}
	long := add(1, time.Minute)
	whole := add(2, 30*time.Second)
	short := add(1, 20*time.Second)
	grant()
	if !granted(long) || granted(whole) || !granted(short) {
		t.Fatalf("granted long %v, whole %v, short %v; want the long one, and the short one beside it while the whole-lane one waits",
			granted(long), granted(whole), granted(short))
	}
	l.release(short)
	// The long one now ends in 15 s by its expect: a scenario of 20 s
	// would keep the whole-lane one waiting past it, one of 10 s would not.
	l.mu.Lock()
	long.ends = time.Now().Add(15 * time.Second)
	l.mu.Unlock()
	tooLong := add(1, 20*time.Second)
	fitting := add(1, 10*time.Second)
	grant()
	if granted(tooLong) || !granted(fitting) || granted(whole) {
		t.Fatalf("granted 20 s %v, 10 s %v, whole %v; want only the 10 s one", granted(tooLong), granted(fitting), granted(whole))
	}
	l.release(fitting)
	// Past its expect the long one could end any moment: nobody passes the
	// whole-lane one any more.
	l.mu.Lock()
	long.ends = time.Now().Add(-time.Second)
	l.mu.Unlock()
	tiny := add(1, time.Second)
	grant()
	if granted(tiny) || granted(tooLong) {
		t.Fatalf("granted 1 s %v, 20 s %v beside a scenario past its expect; want none before the whole-lane one", granted(tiny), granted(tooLong))
	}
	l.release(long)
	if !granted(whole) || granted(tiny) {
		t.Fatalf("after the long one: whole %v, 1 s %v; want the whole-lane one first", granted(whole), granted(tiny))
	}
}
