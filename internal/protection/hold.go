package protection

import (
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// hold is an operator's pause of delivery as this instance follows it
// (`forwarder outbox pause`; docs/operations.md, "Planned maintenance"):
// while it holds, no request goes, not even a probe. Unlike a Retry-After
// pause, which only ever lengthens, it follows the shared state both ways:
// a resume ends it at the next read.
type hold struct {
	// on: a pause was in force when the shared state was read.
	on bool
	// end is when it ends on the local clock; zero: until resumed.
	end time.Time
	// since and until are the pause's own times (the database's clock),
	// for the metrics; until is zero for a pause until resumed.
	since, until time.Time
	by, reason   string
}

// holds says whether delivery is held at now.
func (h hold) holds(now time.Time) bool {
	return h.on && (h.end.IsZero() || now.Before(h.end))
}

// holdFrom is the hold that the shared pause p asks for, read in a reply
// that arrived at the local time arrived: what was left of the pause counts
// from then, as a Retry-After's does (a slow reply lengthens it, never
// shortens it).
func holdFrom(p outboxdb.DeliveryPause, arrived time.Time) hold {
	if !p.InForce {
		return hold{}
	}
	h := hold{on: true, since: p.Since, until: p.Until, by: p.By, reason: p.Reason}
	if !p.Until.IsZero() {
		h.end = arrived.Add(p.Left)
	}
	return h
}
