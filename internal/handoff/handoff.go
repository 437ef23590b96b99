// Package handoff connects the outbox components of one process: the outbox
// processor inserts new rows already claimed for the process's own
// dispatcher (the outbox_retry input) when it has room, and hands them over
// in memory instead of notifying it; the output tells the dispatcher when a
// retry it scheduled will be due. Components find each other by the DSN they
// were configured with, so a pipeline whose processor, input and output name
// the same database is connected without any configuration.
//
// Nothing here is needed for correctness: rows that are not handed over are
// inserted PENDING and claimed from the database, and a dispatcher that
// learns nothing of a retry finds it by polling. A handed-over row is an
// ordinary claim in the database (IN_PROGRESS, claim token, lease), so a
// crash before its result is written is recovered by the lease, as for any
// claim.
package handoff

import (
	"slices"
	"sync"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// A Dispatcher takes rows inserted already claimed for it.
type Dispatcher interface {
	// Claim says how rows are claimed for this dispatcher: its lease and
	// claimer id (Limit is not used).
	Claim() outboxdb.DirectClaim
	// Reserve grants up to n of the dispatcher's free slots to rows about
	// to be inserted claimed for it: 0 when it has no room, is waiting for
	// room to claim rows that are due in the database, or is closing.
	// Every grant must be ended by one Deliver.
	Reserve(n int) int
	// Deliver hands over rows inserted claimed and ends the reservation of
	// granted slots; rows may be nil when the insert failed. Rows are at
	// most granted, except rows a retried insert recovered from an attempt
	// whose reply was lost (see outboxdb.DirectClaim.Retry): those are
	// taken even beyond the dispatcher's room. It returns false, taking
	// nothing, when the dispatcher has closed meanwhile: the caller must
	// then release the rows.
	Deliver(granted int, rows []outboxdb.ClaimedRow) bool
	// DueAt says a row will be due at t (a retry just scheduled).
	DueAt(t time.Time)
}

var registry struct {
	sync.RWMutex
	byDSN map[string][]Dispatcher
}

// Register makes d the dispatcher of dsn for this process until the
// returned function is called. With several registered for one DSN, Lookup
// returns the earliest.
func Register(dsn string, d Dispatcher) (unregister func()) {
	registry.Lock()
	defer registry.Unlock()
	if registry.byDSN == nil {
		registry.byDSN = map[string][]Dispatcher{}
	}
	registry.byDSN[dsn] = append(registry.byDSN[dsn], d)
	var once sync.Once
	return func() {
		once.Do(func() {
			registry.Lock()
			defer registry.Unlock()
			ds := slices.DeleteFunc(registry.byDSN[dsn], func(x Dispatcher) bool { return x == d })
			if len(ds) == 0 {
				delete(registry.byDSN, dsn)
				return
			}
			registry.byDSN[dsn] = ds
		})
	}
}

// Lookup returns the dispatcher registered for dsn, or nil.
func Lookup(dsn string) Dispatcher {
	registry.RLock()
	defer registry.RUnlock()
	if ds := registry.byDSN[dsn]; len(ds) > 0 {
		return ds[0]
	}
	return nil
}

// NoteDue tells every dispatcher registered for dsn that a row will be due
// at t.
func NoteDue(dsn string, t time.Time) {
	registry.RLock()
	ds := slices.Clone(registry.byDSN[dsn])
	registry.RUnlock()
	for _, d := range ds {
		d.DueAt(t)
	}
}
