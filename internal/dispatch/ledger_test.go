package dispatch

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

func row(id int64, size int) outboxdb.Record {
	lease := time.Unix(1000+id, 0)
	return outboxdb.Record{ID: id, ClaimToken: "t" + string(rune('a'+id%26)), Payload: make([]byte, size),
		NextRetryAt: &lease}
}

func ids(refs []outboxdb.ClaimRef) []int64 {
	out := make([]int64, len(refs))
	for i, r := range refs {
		out[i] = r.ID
	}
	slices.Sort(out)
	return out
}

func TestLedger(t *testing.T) {
	t.Parallel()

	t.Run("RoomCountsHeldAndReservedRows", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 5})
		if rows, bytes := l.Room(); rows != 5 || bytes != -1 {
			t.Fatalf("empty ledger: room %d rows, %d bytes; want 5, unbounded", rows, bytes)
		}
		l.Hold([]outboxdb.Record{row(1, 10), row(2, 10)}, time.Time{})
		g := reserve(l, []int{1, 1, 1, 1})
		if g.Rows != 3 {
			t.Fatalf("granted %d rows with 3 free, want 3", g.Rows)
		}
		if rows, _ := l.Room(); rows != 0 {
			t.Fatalf("room %d while every slot is held or reserved", rows)
		}
		if !l.Deliver(g, []outboxdb.Record{row(3, 1)}) { // two keys existed already
			t.Fatal("Deliver refused on an open ledger")
		}
		if rows, _ := l.Room(); rows != 2 {
			t.Fatalf("room %d after delivering 1 of 3 granted, want 2", rows)
		}
	})

	t.Run("DirectRowsBoundGrantsNotClaims", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10, DirectRows: 4})
		l.Hold([]outboxdb.Record{row(1, 1), row(2, 1), row(3, 1)}, time.Time{})
		g := reserve(l, []int{1, 1, 1})
		if g.Rows != 1 {
			t.Fatalf("granted %d rows with 3 of 4 direct rows held, want 1", g.Rows)
		}
		l.Deliver(g, []outboxdb.Record{row(4, 1)})
		if g := reserve(l, []int{1}); g.Rows != 0 {
			t.Fatalf("granted %+v with every direct row held", g)
		}
		if rows, _ := l.Room(); rows != 6 {
			t.Fatalf("claim room %d with 4 of 10 rows held, want 6: the direct bound must not limit claims", rows)
		}
		if g := l.ReserveChain(2, time.Now()); g.Rows != 2 {
			t.Fatalf("chained grant %+v past the direct bound, want 2 rows: a chain keeps its key's slot", g)
		}
		if wide := NewLedger(Limits{Rows: 3, DirectRows: 5}); reserve(wide, []int{1, 1, 1, 1}).Rows != 3 {
			t.Fatal("a direct bound above Rows granted more than Rows")
		}
		if unset := NewLedger(Limits{Rows: 3}); reserve(unset, []int{1, 1, 1, 1}).Rows != 3 {
			t.Fatal("without a direct bound ReserveWithin did not grant up to Rows")
		}
	})

	t.Run("ByteBudgetAdmitsOneLargeRowAlone", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 100, Bytes: 100})
		if g := reserve(l, []int{500, 1}); g.Rows != 1 || g.Bytes != 500 {
			t.Fatalf("an empty ledger granted %+v to a 500-byte row, want it alone", g)
		}
		l2 := NewLedger(Limits{Rows: 100, Bytes: 100})
		l2.Hold([]outboxdb.Record{row(1, 60)}, time.Time{})
		if g := reserve(l2, []int{30, 30}); g.Rows != 1 || g.Bytes != 30 {
			t.Fatalf("with 40 bytes free granted %+v, want only the first 30-byte row", g)
		}
		if _, bytes := l2.Room(); bytes != 10 {
			t.Fatalf("byte room %d, want 100-60-30 = 10", bytes)
		}
		l2.Settle([]outboxdb.ClaimRef{row(1, 60).Ref()})
		if _, bytes := l2.Room(); bytes != 70 {
			t.Fatalf("byte room %d after settling the held row, want 70", bytes)
		}
	})

	t.Run("NoGrantsWhileWaitingForRoomOrClosed", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		l.SetWaitForRoom(true)
		if g := reserve(l, []int{1}); g.Rows != 0 {
			t.Fatalf("granted %+v while the dispatcher waits for room", g)
		}
		l.SetWaitForRoom(false)
		g := reserve(l, []int{1})
		l.Close()
		if l.Deliver(g, []outboxdb.Record{row(1, 1)}) {
			t.Fatal("a closed ledger took delivered rows")
		}
		if g := reserve(l, []int{1}); g.Rows != 0 {
			t.Fatal("a closed ledger granted room")
		}
		if l.Hold([]outboxdb.Record{row(2, 1)}, time.Time{}) {
			t.Fatal("a closed ledger took claimed rows")
		}
	})

	t.Run("TakeHandsOutDeliveredRowsInOrder", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		l.Deliver(reserve(l, []int{1, 1, 1}), []outboxdb.Record{row(1, 1), row(2, 1), row(3, 1)})
		if got := l.Take(2); len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 {
			t.Fatalf("Take(2) = %v", got)
		}
		if l.Queued() != 1 || l.Held() != 3 {
			t.Fatalf("queued %d held %d, want 1 and 3 (taken rows stay held until settled)", l.Queued(), l.Held())
		}
	})

	t.Run("SettleIgnoresAnotherClaimOfTheRow", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		r := row(1, 1)
		l.Hold([]outboxdb.Record{r}, time.Time{})
		l.Settle([]outboxdb.ClaimRef{{ID: 1, ClaimToken: "someone else's"}})
		if l.Held() != 1 {
			t.Fatal("a settle under another token forgot the claim")
		}
		l.Settle([]outboxdb.ClaimRef{r.Ref()})
		if l.Held() != 0 {
			t.Fatal("the claim is still held after its settle")
		}
	})

	t.Run("AnAckNamesTheClaimsNoResultWasWrittenFor", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		recorded, dropped, lost, fenced := row(1, 1), row(2, 1), row(3, 1), row(4, 1)
		l.Hold([]outboxdb.Record{recorded, dropped, lost, fenced}, time.Time{})
		l.Recorded([]outboxdb.Result{
			{ID: recorded.ID, ClaimToken: recorded.ClaimToken},
			// A result of an earlier claim of row 2 is not this claim's.
			{ID: dropped.ID, ClaimToken: "an earlier claim"},
		})
		l.Renewed([]outboxdb.ClaimRef{lost.Ref()}, nil, time.Time{}) // another instance took row 3
		l.Settle([]outboxdb.ClaimRef{fenced.Ref()})                  // row 4: given back meanwhile
		got := l.SettleAcked([]outboxdb.ClaimRef{recorded.Ref(), dropped.Ref(), lost.Ref(), fenced.Ref()})
		if !slices.Equal(ids(got), []int64{2}) {
			t.Fatalf("unrecorded %v, want [2]: only a held claim, not lost, without a result", ids(got))
		}
		if l.Held() != 0 {
			t.Fatalf("%d claims still held after the ack", l.Held())
		}
	})

	t.Run("RenewalsMoveLeasesAndMarkLostClaims", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		a, b, c := row(1, 1), row(2, 1), row(3, 1)
		l.Hold([]outboxdb.Record{a, b, c}, time.Time{})
		asked := l.Expiring(time.Unix(1002, 500))
		if got := ids(asked); !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("expiring before 1002.5: %v, want rows 1 and 2", got)
		}
		later := time.Unix(2000, 0)
		if lost := l.Renewed(asked, map[int64]time.Time{1: later}, time.Time{}); lost != 1 {
			t.Fatalf("%d lost, want row 2", lost)
		}
		if d, ok := l.Lease(a.Ref()); !ok || !d.Equal(later) {
			t.Fatalf("row 1 lease %v %v, want renewed to %v", d, ok, later)
		}
		if _, ok := l.Lease(b.Ref()); ok {
			t.Fatal("a lost claim still reports a lease")
		}
		if got := ids(l.Expiring(time.Unix(5000, 0))); !slices.Equal(got, []int64{1, 3}) {
			t.Fatalf("expiring: %v, lost row 2 must not be renewed again", got)
		}
	})

	// The end of a lease the database writes is on the database's clock:
	// with this instance's clock a minute behind, a lease of 60 s looked two
	// minutes long, and ran out before the renewal at half of it. The
	// ledger keeps the earlier of that end and the lease counted on this
	// instance's clock from the statement (a clock ahead only renews
	// earlier), for claims, inserts handed over and renewals alike.
	t.Run("ALeaseEndsAtTheEarlierOfTheTwoClocks", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		claimed, handed := row(1, 1), row(2, 1) // the database wrote 1001 and 1002
		l.Hold([]outboxdb.Record{claimed}, time.Unix(941, 0))
		g := reserve(l, []int{1})
		g.until = time.Unix(5000, 0) // this clock behind: the database's end is the earlier
		l.Deliver(g, []outboxdb.Record{handed})
		for _, c := range []struct {
			r    outboxdb.Record
			want time.Time
		}{{claimed, time.Unix(941, 0)}, {handed, time.Unix(1002, 0)}} {
			if d, ok := l.Lease(c.r.Ref()); !ok || !d.Equal(c.want) {
				t.Errorf("row %d: lease until %v (%v), want %v", c.r.ID, d, ok, c.want)
			}
		}
		if got := ids(l.Expiring(time.Unix(971, 0))); !slices.Equal(got, []int64{1}) {
			t.Fatalf("expiring before 971: %v, want row 1, whose lease ends at 941 on this clock", got)
		}
		l.Renewed([]outboxdb.ClaimRef{claimed.Ref(), handed.Ref()}, map[int64]time.Time{1: time.Unix(1100, 0), 2: time.Unix(1100, 0)}, time.Unix(1040, 0))
		if d, _ := l.Lease(claimed.Ref()); !d.Equal(time.Unix(1040, 0)) {
			t.Errorf("renewed lease until %v, want 1040, this instance's bound", d)
		}
	})

	t.Run("CloseSeparatesUnsentRows", func(t *testing.T) {
		t.Parallel()
		l := NewLedger(Limits{Rows: 10})
		l.Hold([]outboxdb.Record{row(1, 1)}, time.Time{})
		l.Deliver(reserve(l, []int{1, 1}), []outboxdb.Record{row(2, 1), row(3, 1)})
		l.Take(1) // row 2 goes down the pipeline
		unsent, others := l.Close()
		if !slices.Equal(ids(unsent), []int64{3}) || !slices.Equal(ids(others), []int64{1, 2}) {
			t.Fatalf("unsent %v others %v; want [3] and [1 2]", ids(unsent), ids(others))
		}
	})
}

// clock is a settable clock for a ledger's now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// pacedLedger returns a ledger holding rows rows (ids 1..rows, one byte
// each), every slot taken, on a clock the test moves.
func pacedLedger(rows int) (*Ledger, *clock) {
	c := &clock{t: time.Unix(5000, 0)}
	l := NewLedger(Limits{Rows: rows})
	l.now = c.now
	for id := range rows {
		l.Hold([]outboxdb.Record{row(int64(id+1), 1)}, time.Time{})
	}
	return l, c
}

// reserve is l.ReserveWithin without a wait.
func reserve(l *Ledger, sizes []int) Grant {
	return l.ReserveWithin(context.Background(), sizes, 0)
}

// reserveWithin runs l.ReserveWithin in a goroutine.
func reserveWithin(ctx context.Context, l *Ledger, sizes []int, bound time.Duration) <-chan Grant {
	ch := make(chan Grant, 1)
	go func() { ch <- l.ReserveWithin(ctx, sizes, bound) }()
	return ch
}

// granted is what ch gives; it fails if that takes more than a few seconds,
// which only a wait that should not have happened takes (their bounds are a
// minute or more).
func granted(t *testing.T, ch <-chan Grant, what string) Grant {
	t.Helper()
	select {
	case g := <-ch:
		return g
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still waiting for room", what)
		return Grant{}
	}
}

// waiting fails if ch gives a grant within a moment: the reservation should
// be waiting for room.
func waiting(t *testing.T, ch <-chan Grant, what string) {
	t.Helper()
	select {
	case g := <-ch:
		t.Fatalf("%s: granted %+v at once, want a wait for room", what, g)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestLedgerReserveWithin(t *testing.T) {
	t.Parallel()
	settle := func(l *Ledger, ids ...int64) {
		for _, id := range ids {
			l.Settle([]outboxdb.ClaimRef{row(id, 1).Ref()})
		}
	}

	t.Run("WaitsWhileDeliveryMovesUntilEveryRowFits", func(t *testing.T) {
		t.Parallel()
		l, c := pacedLedger(4)
		settle(l, 1) // delivery moves; one slot free
		c.advance(stalledAfter - time.Millisecond)
		ch := reserveWithin(context.Background(), l, []int{1, 1}, time.Hour)
		waiting(t, ch, "one slot free for two rows")
		settle(l, 2)
		if g := granted(t, ch, "two slots free"); g.Rows != 2 {
			t.Fatalf("granted %+v once two slots were free, want both rows", g)
		}
		if rows, _ := l.Room(); rows != 0 {
			t.Fatalf("room %d after the grant, want 0", rows)
		}
	})

	t.Run("TheGrantSaysHowLongItWaited", func(t *testing.T) {
		t.Parallel()
		l, c := pacedLedger(4)
		settle(l, 1)
		ch := reserveWithin(context.Background(), l, []int{1, 1}, time.Hour)
		waiting(t, ch, "one slot free for two rows")
		c.advance(30 * time.Millisecond)
		settle(l, 2)
		if g := granted(t, ch, "two slots free"); g.Rows != 2 || g.Waited != 30*time.Millisecond {
			t.Fatalf("granted %+v after 30 ms, want both rows and Waited 30ms", g)
		}
	})

	t.Run("DoesNotWaitForAPlatformThatNeverAnswered", func(t *testing.T) {
		t.Parallel()
		l, _ := pacedLedger(4) // rows held, none ever left: the platform hangs
		if g := granted(t, reserveWithin(context.Background(), l, []int{1}, time.Hour), "nothing ever left"); g.Rows != 0 {
			t.Fatalf("granted %+v from a full ledger", g)
		}
	})

	t.Run("StopsWaitingOnceDeliveryStalls", func(t *testing.T) {
		t.Parallel()
		l, c := pacedLedger(4)
		settle(l, 1)
		c.advance(stalledAfter) // nothing left since: the platform hangs now
		if g := granted(t, reserveWithin(context.Background(), l, []int{1, 1}, time.Hour), "nothing left for stalledAfter"); g.Rows != 1 || g.Waited != 0 {
			t.Fatalf("granted %+v, want the one row that fits, at once", g)
		}
	})

	t.Run("GivesUpWhenTheLedgerStopsGrantingOrAPeerIsIdle", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name string
			do   func(*Ledger, *clock)
			rows int
		}{
			{"breaker open", func(l *Ledger, _ *clock) { l.SetBlocked(true) }, 0},
			{"waiting for room for due rows", func(l *Ledger, _ *clock) { l.SetWaitForRoom(true) }, 0},
			{"closed", func(l *Ledger, _ *clock) { l.Close() }, 0},
			{"a peer idle", func(l *Ledger, c *clock) { l.PeerIdle(c.now().Add(time.Second)) }, 1},
		} {
			l, clk := pacedLedger(4)
			settle(l, 1)
			ch := reserveWithin(context.Background(), l, []int{1, 1}, time.Hour)
			waiting(t, ch, c.name)
			c.do(l, clk)
			if g := granted(t, ch, c.name); g.Rows != c.rows {
				t.Errorf("%s: granted %+v, want %d rows", c.name, g, c.rows)
			}
		}
	})

	t.Run("GrantsWhatFitsAtTheBound", func(t *testing.T) {
		t.Parallel()
		l, _ := pacedLedger(4)
		settle(l, 1)
		if g := granted(t, reserveWithin(context.Background(), l, []int{1, 1, 1}, 50*time.Millisecond), "bound passed"); g.Rows != 1 {
			t.Fatalf("granted %+v at the bound, want the one row that fits", g)
		}
	})

	t.Run("DoesNotWaitForRowsThatNeverFit", func(t *testing.T) {
		t.Parallel()
		c := &clock{t: time.Unix(5000, 0)}
		l := NewLedger(Limits{Rows: 10, DirectRows: 2})
		l.now = c.now
		l.Hold([]outboxdb.Record{row(1, 1), row(2, 1)}, time.Time{})
		settle(l, 1)
		if g := granted(t, reserveWithin(context.Background(), l, []int{1, 1, 1}, time.Hour), "three rows, two direct slots"); g.Rows != 1 {
			t.Fatalf("granted %+v, want the one row that fits, at once", g)
		}
	})

	t.Run("ACancelledWaitReservesNothing", func(t *testing.T) {
		t.Parallel()
		l, _ := pacedLedger(4)
		settle(l, 1)
		ctx, cancel := context.WithCancel(context.Background())
		ch := reserveWithin(ctx, l, []int{1, 1}, time.Hour)
		waiting(t, ch, "one slot free for two rows")
		cancel()
		if g := granted(t, ch, "cancelled"); g.Rows != 0 {
			t.Fatalf("granted %+v after the context ended", g)
		}
		if rows, _ := l.Room(); rows != 1 {
			t.Fatalf("room %d after a cancelled wait, want 1: nothing reserved", rows)
		}
	})
}
