package handoff

import (
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

type stub struct{ due []time.Time }

func (s *stub) Claim() outboxdb.DirectClaim             { return outboxdb.DirectClaim{} }
func (s *stub) Reserve(int) int                         { return 0 }
func (s *stub) Deliver(int, []outboxdb.ClaimedRow) bool { return true }
func (s *stub) DueAt(t time.Time)                       { s.due = append(s.due, t) }

func TestRegistry(t *testing.T) {
	const dsn, other = "postgres://db-a/outbox", "postgres://db-b/outbox"
	first, second := &stub{}, &stub{}
	if Lookup(dsn) != nil {
		t.Fatal("a dispatcher before any registered")
	}
	unregisterFirst := Register(dsn, first)
	unregisterSecond := Register(dsn, second)
	if Lookup(dsn) != first {
		t.Fatal("Lookup does not return the earliest registered dispatcher")
	}
	if Lookup(other) != nil {
		t.Fatal("a dispatcher of another DSN was found")
	}

	at := time.Now().Add(time.Minute)
	NoteDue(dsn, at)
	NoteDue(other, at)
	if len(first.due) != 1 || len(second.due) != 1 || !first.due[0].Equal(at) {
		t.Fatalf("NoteDue reached %v and %v, want both dispatchers of the DSN once", first.due, second.due)
	}

	unregisterFirst()
	unregisterFirst() // idempotent: must not remove the other one
	if Lookup(dsn) != second {
		t.Fatal("after unregistering the first, Lookup does not return the second")
	}
	unregisterSecond()
	if Lookup(dsn) != nil {
		t.Fatal("a dispatcher is still registered after both unregistered")
	}
	NoteDue(dsn, at) // nobody registered: nothing happens
	if len(second.due) != 1 {
		t.Fatal("an unregistered dispatcher was told of a due row")
	}
}
