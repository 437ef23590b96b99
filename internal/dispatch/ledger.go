package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Ledger is the dispatcher's account of the rows it holds: rows it claimed,
// and rows the outbox processor inserted already claimed for it (direct
// dispatch), until their outcome is settled. It bounds them by count and by
// payload bytes, so that what is held is sent well within its lease and
// large messages cannot exhaust memory.
//
// The ledger only counts and remembers; it does no I/O, so it is tested
// without a database (ledger_test.go). Every method is safe for concurrent
// use: the dispatcher, the outbox processor and the output call it from
// their own goroutines.
type Ledger struct {
	limits Limits

	mu sync.Mutex
	// held maps the id of every row held to its claim.
	held      map[int64]*heldRow
	heldBytes int64
	// reserved slots (and bytes) were granted to rows about to be inserted
	// claimed and are not delivered yet.
	reserved      int
	reservedBytes int64
	// queue holds rows delivered by direct dispatch and not yet handed to
	// the pipeline (they are in held too).
	queue []outboxdb.Record
	// waitForRoom is set while the dispatcher waits for room to claim rows
	// due in the database: no reservations are granted meanwhile, so that
	// retries and expired claims are not starved by a flow of new rows.
	waitForRoom bool
	// blocked is set while the platform is not to be sent to (breaker open,
	// sending paused): new rows are not claimed for a dispatcher that
	// would only give them back.
	blocked bool
	closed  bool
	// peerIdleUntil: another dispatcher of the database found nothing due
	// to claim lately (PeerIdle); until then ReserveChain grants nothing
	// and ReserveWithin does not wait.
	peerIdleUntil time.Time
	// lastLeft is when rows last left the ledger settled: delivery is
	// moving while it is less than stalledAfter ago (ReserveWithin).
	lastLeft time.Time
	// changed is closed, and replaced, when room is freed or the ledger
	// stops granting: ReserveWithin's waiters look again.
	changed chan struct{}
	// now is the clock (time.Now; tests set it).
	now func() time.Time
}

// heldRow is one held claim.
type heldRow struct {
	token    string
	deadline time.Time
	size     int64
	// lost is set when a lease renewal found the claim gone (its lease had
	// run out and another dispatcher took the row): the row must not be
	// sent any more, its result would be fenced out.
	lost bool
	// recorded is set once a result of this claim was written (matched
	// or fenced out): the output has dealt with it.
	recorded bool
}

// Limits bound what a ledger holds.
type Limits struct {
	// Rows is the most rows held.
	Rows int
	// Bytes is the most payload bytes held beyond the first row (0: no
	// byte bound).
	Bytes int64
	// DirectRows is the most rows held for ReserveWithin to grant more: new rows
	// are handed over at insert only while fewer are held, so that past it
	// they are inserted due, where every instance can claim them (0: Rows).
	DirectRows int
}

// NewLedger returns a ledger holding at most what limits allow.
func NewLedger(limits Limits) *Ledger {
	if limits.DirectRows <= 0 || limits.DirectRows > limits.Rows {
		limits.DirectRows = limits.Rows
	}
	return &Ledger{limits: limits, held: map[int64]*heldRow{}, changed: make(chan struct{}), now: time.Now}
}

// stalledAfter is how long after rows last left the ledger ReserveWithin
// still takes delivery to be moving. On a backlog a result write frees a
// few hundred rows every few tens of milliseconds, with gaps longer than a
// chunk's wait: a window as short as the wait left a fifth of the rows
// PENDING (docs/benchmarks.md).
const stalledAfter = time.Second

// changedLocked wakes ReserveWithin's waiters.
func (l *Ledger) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Room is how much more the dispatcher may claim now: rows, and payload
// bytes (-1: no byte bound). A claim may always take one row whatever its
// size when nothing is held, so a message larger than the byte budget is
// still delivered, alone.
func (l *Ledger) Room() (rows int, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.roomLocked()
}

func (l *Ledger) roomLocked() (rows int, bytes int64) {
	return l.roomUnderLocked(l.limits.Rows)
}

// roomUnderLocked is the room left below maxRows rows held.
func (l *Ledger) roomUnderLocked(maxRows int) (rows int, bytes int64) {
	rows = max(maxRows-len(l.held)-l.reserved, 0)
	if l.limits.Bytes <= 0 {
		return rows, -1
	}
	return rows, max(l.limits.Bytes-l.heldBytes-l.reservedBytes, 0)
}

// Held is how many rows are held.
func (l *Ledger) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// SetWaitForRoom says whether the dispatcher is waiting for room to claim
// rows due in the database; meanwhile ReserveWithin grants nothing.
func (l *Ledger) SetWaitForRoom(v bool) { l.setHold(&l.waitForRoom, v) }

// SetBlocked says whether sending to the platform is blocked; meanwhile
// ReserveWithin grants nothing.
func (l *Ledger) SetBlocked(v bool) { l.setHold(&l.blocked, v) }

// setHold sets one of the reasons to grant nothing, waking the reservations
// waiting for room when it begins: they are granted nothing at once.
func (l *Ledger) setHold(reason *bool, v bool) {
	l.mu.Lock()
	if v && !*reason {
		l.changedLocked()
	}
	*reason = v
	l.mu.Unlock()
}

// Grant is a reservation of room for rows about to be inserted claimed.
type Grant struct {
	Rows  int
	Bytes int64
	// Waited is how long ReserveWithin waited for room (0: not at all).
	Waited time.Duration
	// until bounds the leases of the rows claimed under the grant (see
	// Hold); the dispatcher sets it when it grants.
	until time.Time
}

// ReserveWithin grants room to the first of the rows about to be inserted
// claimed, whose payload sizes are given in insertion order: as many leading
// rows as fit below Limits.DirectRows, none while the dispatcher waits for
// room or is blocked or closed. Every grant must be ended by one Deliver.
// With bound > 0 it waits up to bound for room for every row while delivery
// is moving, so that a backlog read from Kafka is inserted claimed at the
// pace the dispatcher sends it, rather than PENDING to be claimed again.
// Delivery is moving while rows have left the ledger within stalledAfter.
// The wait ends, granting what fits, as soon as the room is there, the
// ledger stops granting (waiting for room, blocked, closed), another
// dispatcher is idle (PeerIdle: the rows are better PENDING, for it), or
// bound has passed; when ctx ends nothing is granted. A platform
// that hangs or is down keeps its rows: once stalledAfter has passed since
// the last left, the ingest does not wait at all. Rows that could not fit
// even in an empty ledger are not waited for.
func (l *Ledger) ReserveWithin(ctx context.Context, sizes []int, bound time.Duration) Grant {
	l.mu.Lock()
	defer l.mu.Unlock()
	wait := bound > 0 && l.fitsEmptyLocked(sizes)
	var (
		timer *time.Timer
		since time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		g := l.fitLocked(sizes)
		if !wait || g.Rows == len(sizes) || !l.waitsLocked() {
			if timer != nil {
				g.Waited = l.now().Sub(since)
			}
			return l.takeLocked(g)
		}
		changed := l.changed
		if timer == nil {
			timer = time.NewTimer(bound)
			since = l.now()
		}
		l.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			wait = false // grant what fits now
		case <-ctx.Done():
		}
		l.mu.Lock()
		if ctx.Err() != nil {
			return Grant{}
		}
	}
}

// waitsLocked says whether a reservation short of room waits for it:
// reservations are granted, delivery is moving and no other dispatcher is
// idle.
func (l *Ledger) waitsLocked() bool {
	now := l.now()
	return !l.closed && !l.waitForRoom && !l.blocked &&
		now.Before(l.lastLeft.Add(stalledAfter)) && !now.Before(l.peerIdleUntil)
}

// fitsEmptyLocked says whether rows of these sizes would all fit below
// Limits.DirectRows in an empty ledger.
func (l *Ledger) fitsEmptyLocked(sizes []int) bool {
	if len(sizes) > l.limits.DirectRows {
		return false
	}
	var total int64
	for _, s := range sizes {
		total += int64(s)
	}
	return l.limits.Bytes <= 0 || total <= l.limits.Bytes
}

// fitLocked is the room for as many leading rows as fit now, not yet
// reserved: none while the dispatcher waits for room, is blocked or closed.
func (l *Ledger) fitLocked(sizes []int) Grant {
	if l.closed || l.waitForRoom || l.blocked {
		return Grant{}
	}
	rows, bytes := l.roomUnderLocked(l.limits.DirectRows)
	var g Grant
	for _, size := range sizes {
		if g.Rows == rows {
			break
		}
		if bytes >= 0 && g.Bytes+int64(size) > bytes && !(g.Rows == 0 && len(l.held) == 0 && l.reserved == 0) {
			break
		}
		g.Rows++
		g.Bytes += int64(size)
	}
	return g
}

// takeLocked reserves the room g.
func (l *Ledger) takeLocked(g Grant) Grant {
	l.reserved += g.Rows
	l.reservedBytes += g.Bytes
	return g
}

// ReserveChain grants n rows to a result write that may claim the rows it
// releases for the dispatcher (chained dispatch), beyond the room left: each
// of them takes the place of a row of its own key that the same write
// finishes, and that row leaves the ledger once its batch is acknowledged,
// so the excess is bounded by the results being written and short-lived.
// Unlike ReserveWithin it grants rows while the dispatcher waits for room: a
// chain keeps the slot its key had, so the room left for rows due in the
// database is the same as without it. Nothing is granted once closed, nor
// at now while another dispatcher is idle (PeerIdle): the released rows are
// then due for whichever instance claims first. Payload bytes are counted
// when the rows are delivered. Every grant must be ended by one Deliver.
func (l *Ledger) ReserveChain(n int, now time.Time) Grant {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || n <= 0 || now.Before(l.peerIdleUntil) {
		return Grant{}
	}
	l.reserved += n
	return Grant{Rows: n}
}

// PeerIdle says another dispatcher of the database found nothing due to
// claim with room to spare, and ReserveChain grants nothing until until. A
// key whose next row this dispatcher would claim with its result could wait
// behind this instance's other requests while that one sends nothing;
// released as due, the row goes to whichever claims it first, this one
// included. A peer says so each time it looks and finds nothing, at most once
// a second: a peer the released rows' notifications keep waking (and that
// others beat to them) renews it before it lapses; one asleep for its poll
// interval lets chains resume until it looks again.
func (l *Ledger) PeerIdle(until time.Time) {
	l.mu.Lock()
	if until.After(l.peerIdleUntil) {
		l.peerIdleUntil = until
		l.changedLocked()
	}
	l.mu.Unlock()
}

// Deliver ends the reservation g and takes the rows inserted claimed under
// it; rows may be fewer than granted (keys that existed, a failed insert),
// and more only when a retried insert recovered claims its lost attempt had
// committed. It returns false, taking nothing, when the ledger was closed
// meanwhile: the caller must then give the rows back.
func (l *Ledger) Deliver(g Grant, rows []outboxdb.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserved -= g.Rows
	l.reservedBytes -= g.Bytes
	if l.closed {
		return false
	}
	if len(rows) < g.Rows {
		l.changedLocked() // room reserved and not taken is free again
	}
	l.holdLocked(rows, g.until)
	l.queue = append(l.queue, rows...)
	return true
}

// Hold takes rows the dispatcher claimed. It returns false, taking nothing,
// when the ledger is closed.
//
// until bounds their leases on this instance's clock: the lease counted
// from before the statement that claimed them was sent. A row's lease is
// the earlier of it and the end the database wrote, which is on the
// database's clock: with this instance's clock behind the database's, that
// end alone would look further away than it is, and the lease would run out
// before its renewal. Zero: the ends the database wrote.
func (l *Ledger) Hold(rows []outboxdb.Record, until time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.holdLocked(rows, until)
	return true
}

func (l *Ledger) holdLocked(rows []outboxdb.Record, until time.Time) {
	for _, r := range rows {
		if old, ok := l.held[r.ID]; ok {
			l.heldBytes -= old.size
		}
		size := int64(len(r.Payload))
		l.held[r.ID] = &heldRow{token: r.ClaimToken, deadline: earliest(r.LeaseExpiresAt(), until), size: size}
		l.heldBytes += size
	}
}

// earliest is the earlier of a lease's end as the database wrote it and
// until, the bound on this instance's clock (zero: none).
func earliest(written, until time.Time) time.Time {
	if !until.IsZero() && until.Before(written) {
		return until
	}
	return written
}

// Take hands out up to n delivered rows, oldest first.
func (l *Ledger) Take(n int) []outboxdb.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	n = min(n, len(l.queue))
	if n == 0 {
		return nil
	}
	rows := l.queue[:n:n]
	l.queue = l.queue[n:]
	if len(l.queue) == 0 {
		l.queue = nil
	}
	return rows
}

// Queued is how many delivered rows wait to be taken.
func (l *Ledger) Queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// Settle forgets claims whose outcome is settled (recorded, released or
// given back). A claim held under another token (the row was claimed again
// since) is kept.
func (l *Ledger) Settle(refs []outboxdb.ClaimRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	left := 0
	for _, r := range refs {
		if h, ok := l.held[r.ID]; ok && h.token == r.ClaimToken {
			l.forgetLocked(r.ID, h)
			left++
		}
	}
	l.leftLocked(left)
}

func (l *Ledger) forgetLocked(id int64, h *heldRow) {
	l.heldBytes -= h.size
	delete(l.held, id)
}

// leftLocked notes that n rows left the ledger.
func (l *Ledger) leftLocked(n int) {
	if n > 0 {
		l.lastLeft = l.now()
		l.changedLocked()
	}
}

// Recorded notes that results of these claims were written.
func (l *Ledger) Recorded(results []outboxdb.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range results {
		if h, ok := l.held[r.ID]; ok && h.token == r.ClaimToken {
			h.recorded = true
		}
	}
}

// SettleAcked settles the claims of an acknowledged batch, and returns
// those that got no result: held under that claim, not lost, and never
// recorded. Their messages did not reach the output (a processor dropped
// them), yet the batch was acknowledged.
func (l *Ledger) SettleAcked(refs []outboxdb.ClaimRef) (unrecorded []outboxdb.ClaimRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	left := 0
	for _, r := range refs {
		h, ok := l.held[r.ID]
		if !ok || h.token != r.ClaimToken {
			continue
		}
		if !h.recorded && !h.lost {
			unrecorded = append(unrecorded, r)
		}
		l.forgetLocked(r.ID, h)
		left++
	}
	l.leftLocked(left)
	return unrecorded
}

// Lease says until when the claim ref holds its row, as far as the ledger
// knows (renewals move it on). ok is false when the ledger does not hold
// that claim, or a renewal found it lost.
func (l *Ledger) Lease(ref outboxdb.ClaimRef) (deadline time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, found := l.held[ref.ID]
	if !found || h.token != ref.ClaimToken || h.lost {
		return time.Time{}, false
	}
	return h.deadline, true
}

// Expiring lists the held claims (not lost) whose lease ends before t, for
// a renewal.
func (l *Ledger) Expiring(t time.Time) []outboxdb.ClaimRef {
	l.mu.Lock()
	defer l.mu.Unlock()
	var refs []outboxdb.ClaimRef
	for id, h := range l.held {
		if !h.lost && h.deadline.Before(t) {
			refs = append(refs, outboxdb.ClaimRef{ID: id, ClaimToken: h.token})
		}
	}
	return refs
}

// Renewed records a renewal of asked: the claims in renewed hold their rows
// until the deadline given, bounded by until as in Hold; the others asked
// for were lost.
func (l *Ledger) Renewed(asked []outboxdb.ClaimRef, renewed map[int64]time.Time, until time.Time) (lost int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range asked {
		h, ok := l.held[r.ID]
		if !ok || h.token != r.ClaimToken {
			continue // settled meanwhile
		}
		if d, ok := renewed[r.ID]; ok {
			h.deadline = earliest(d, until)
			continue
		}
		if !h.lost {
			h.lost = true
			lost++
		}
	}
	return lost
}

// Close refuses any further rows and returns what is held: the rows
// delivered but never taken (they were never sent) and the others.
func (l *Ledger) Close() (unsent, others []outboxdb.ClaimRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.changedLocked()
	queued := make(map[int64]bool, len(l.queue))
	for _, r := range l.queue {
		unsent = append(unsent, r.Ref())
		queued[r.ID] = true
	}
	l.queue = nil
	for id, h := range l.held {
		if !queued[id] {
			others = append(others, outboxdb.ClaimRef{ID: id, ClaimToken: h.token})
		}
	}
	return unsent, others
}

// Closed says whether Close was called.
func (l *Ledger) Closed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// holds says whether ref is held, lost or not.
func (l *Ledger) holds(ref outboxdb.ClaimRef) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[ref.ID]
	return ok && h.token == ref.ClaimToken
}

// WaitingForRoom says whether the dispatcher waits for room to claim.
func (l *Ledger) WaitingForRoom() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waitForRoom
}
