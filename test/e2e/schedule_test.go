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
// breaker and the ramp after it, the global rate limit, an operator's
// pause) runs in the quiet lane, with no scenario of the other lanes beside
// it: next to those on a loaded machine, instances read that state seconds
// late and the checks failed (requests during a pause, rows left unclaimed
// under the rate limit, deliveries twice after a hang), which a run one by
// one does not show as often. The quiet scenarios themselves mostly wait on
// a paused or failing platform at a hundred messages a second (the machine
// idles four fifths of the time they run), so two run side by side. The
// quiet lane opens once the other lanes have run every scenario ready to
// run, and they let none in while it runs one. Within a lane the longest
// start first, so that the suite ends sooner, and a scenario that waits for
// room keeps its turn: while it waits, only scenarios whose expects say
// they end before it can start take the room that is free (backfilling, as
// batch schedulers do), which keeps both seats of a lane busy while a
// scenario that needs the whole lane waits for a long one to end.
var (
	heavyLane = &lane{name: "heavy", room: 2}
	lightLane = &lane{name: "light", room: 2}
	quietLane = (&lane{name: "quiet", room: 2}).waitsFor(heavyLane, lightLane)

	heavy = seat{{heavyLane, 1}}
	alone = seat{{heavyLane, heavyLane.room}}
	light = seat{{lightLane, 1}}
	quiet = seat{{quietLane, 1}}
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
	// after are the lanes this one waits for, before those waiting for it
	// (waitsFor).
	after, before []*lane

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

// lanesMu guards every lane and its tickets.
var lanesMu sync.Mutex

func (l *lane) enqueue(room int, expect time.Duration) *ticket {
	lanesMu.Lock()
	defer lanesMu.Unlock()
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
	lanesMu.Lock()
	tk.ready = true
	lanesMu.Unlock()
	settleOnce.Do(func() { time.Sleep(laneSettle) })
	lanesMu.Lock()
	l.grantLinkedLocked()
	lanesMu.Unlock()
	<-tk.granted
}

func (l *lane) release(tk *ticket) {
	lanesMu.Lock()
	l.used -= tk.room
	l.running = slices.DeleteFunc(l.running, func(r *ticket) bool { return r == tk })
	l.grantLinkedLocked()
	lanesMu.Unlock()
}

// waitsFor makes l wait for others: l lets a scenario in only when none
// runs in them or is ready to, and they let none in while one of l runs.
func (l *lane) waitsFor(others ...*lane) *lane {
	l.after = append(l.after, others...)
	for _, o := range others {
		o.before = append(o.before, l)
	}
	return l
}

// grantLinkedLocked lets in what l and the lanes linked to it by waitsFor
// have room for: a scenario ending in one may open another.
func (l *lane) grantLinkedLocked() {
	for _, x := range slices.Concat([]*lane{l}, l.after, l.before) {
		x.grantLocked()
	}
}

// openLocked says whether the lane may let a scenario in: not while a lane
// it waits for runs a scenario or has one ready, nor while a lane waiting
// for it runs one.
func (l *lane) openLocked() bool {
	for _, o := range l.after {
		if len(o.running) > 0 || slices.ContainsFunc(o.waiting, func(tk *ticket) bool { return tk.ready }) {
			return false
		}
	}
	for _, o := range l.before {
		if len(o.running) > 0 {
			return false
		}
	}
	return true
}

// grantLocked lets the running scenarios in, longest first, as long as the
// next fits. The first that does not fit keeps its turn: those after it
// are let in only when they fit and their expect ends before the time the
// first will have room, by the expects of those running (never, once one
// of those runs past its expect), so that a scenario needing the whole
// lane is not passed over until the end.
func (l *lane) grantLocked() {
	if !l.openLocked() {
		return
	}
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
	add := func(room int, expect time.Duration) *ticket { return readyTicket(l, room, expect) }
	grant := func() {
		lanesMu.Lock()
		l.grantLocked()
		lanesMu.Unlock()
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
	lanesMu.Lock()
	long.ends = time.Now().Add(15 * time.Second)
	lanesMu.Unlock()
	tooLong := add(1, 20*time.Second)
	fitting := add(1, 10*time.Second)
	grant()
	if granted(tooLong) || !granted(fitting) || granted(whole) {
		t.Fatalf("granted 20 s %v, 10 s %v, whole %v; want only the 10 s one", granted(tooLong), granted(fitting), granted(whole))
	}
	l.release(fitting)
	// Past its expect the long one could end any moment: nobody passes the
	// whole-lane one any more.
	lanesMu.Lock()
	long.ends = time.Now().Add(-time.Second)
	lanesMu.Unlock()
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

// TestQuietLaneWaitsForTheOthers: the quiet lane lets two in side by side,
// but only once the lanes it waits for have nothing running or ready, and
// they let none in while a quiet scenario runs; a scenario of theirs that
// becomes ready meanwhile goes before the quiet ones still waiting.
func TestQuietLaneWaitsForTheOthers(t *testing.T) {
	busy := &lane{name: "busy", room: 2}
	q := (&lane{name: "quiet", room: 2}).waitsFor(busy)
	grant := func() {
		lanesMu.Lock()
		q.grantLinkedLocked()
		lanesMu.Unlock()
	}
	first := readyTicket(busy, 1, time.Minute)
	quiet1 := readyTicket(q, 1, 40*time.Second)
	quiet2 := readyTicket(q, 1, 30*time.Second)
	quiet3 := readyTicket(q, 1, 20*time.Second)
	grant()
	if !granted(first) || granted(quiet1) || granted(quiet2) {
		t.Fatalf("granted busy %v, quiet %v %v; want only the busy lane's", granted(first), granted(quiet1), granted(quiet2))
	}
	busy.release(first)
	if !granted(quiet1) || !granted(quiet2) || granted(quiet3) {
		t.Fatalf("after the busy lane emptied: quiet %v %v %v; want the two longest side by side", granted(quiet1), granted(quiet2), granted(quiet3))
	}
	late := readyTicket(busy, 1, time.Second)
	grant()
	if granted(late) {
		t.Fatal("the busy lane let a scenario in beside two quiet ones")
	}
	q.release(quiet1)
	if granted(late) || granted(quiet3) {
		t.Fatalf("one quiet scenario still running: busy %v, quiet %v; want neither (the busy one is ready, so it goes first)", granted(late), granted(quiet3))
	}
	q.release(quiet2)
	if !granted(late) || granted(quiet3) {
		t.Fatalf("no quiet scenario running: busy %v, quiet %v; want the busy one alone", granted(late), granted(quiet3))
	}
	busy.release(late)
	if !granted(quiet3) {
		t.Fatal("the last quiet scenario was not let in once the busy lane emptied")
	}
}

// readyTicket queues a running scenario in l.
func readyTicket(l *lane, room int, expect time.Duration) *ticket {
	tk := l.enqueue(room, expect)
	lanesMu.Lock()
	tk.ready = true
	lanesMu.Unlock()
	return tk
}

func granted(tk *ticket) bool {
	select {
	case <-tk.granted:
		return true
	default:
		return false
	}
}
