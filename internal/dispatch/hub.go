package dispatch

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/protection"
	"github.com/forwarder/forwarder/internal/streamdb"
)

// Hub links the claim engine of one stream to the stream's other outbox
// components on one database: the outbox processor hands it new rows
// (direct dispatch), the http_forwarder output attaches itself (its
// request timeout, its attempts, its platform protection), and all share
// the stream's pool (streamdb.DB, embedded). They find it through the
// stream's resources, so two streams of one process never hand rows to
// each other.
//
// Nothing that goes through the hub is needed for correctness: a processor
// without a dispatcher inserts rows PENDING for any instance to claim, and
// an output without one relies on the lease its messages carry and refuses
// to send while its protection says not to.
type Hub struct {
	*streamdb.DB

	mu         sync.Mutex
	dispatcher *Dispatcher
	output     *Output
}

// Output is what the stream's output tells the claim engine about itself,
// in one call when it is built (AttachOutput).
type Output struct {
	// Timeout bounds one request to the platform.
	Timeout time.Duration
	// MaxAttempts is the attempts a row may use (retry.max_attempts).
	MaxAttempts int
	// Protection guards the platform the output sends to. While it blocks
	// sending (breaker open, a pause asked for) the dispatcher claims
	// nothing but the probes it grants, so rows wait PENDING with their
	// attempts instead of being claimed and given back.
	Protection *protection.Gate
}

type hubKey struct{ db *streamdb.DB }

// HubFor returns the hub of the database dsn in the stream of res, creating
// it on first use (see streamdb.For). Nothing touches the network.
func HubFor(res *service.Resources, dsn string) (*Hub, error) {
	db, err := streamdb.For(res, dsn)
	if err != nil {
		return nil, err
	}
	return hubOf(res, db), nil
}

// HubFromParsed returns the hub of the database a component's config names
// (see streamdb.FromParsed).
func HubFromParsed(conf *service.ParsedConfig, res *service.Resources) (*Hub, error) {
	db, err := streamdb.FromParsed(conf, res)
	if err != nil {
		return nil, err
	}
	return hubOf(res, db), nil
}

// NewHub returns a hub that belongs to no stream, for tests and tools.
func NewHub(dsn string) (*Hub, error) {
	return HubFor(service.MockResources(), dsn)
}

func hubOf(res *service.Resources, db *streamdb.DB) *Hub {
	v, _ := res.GetOrSetGeneric(hubKey{db: db}, &Hub{DB: db})
	return v.(*Hub)
}

// ErrSecondDispatcher is returned when a stream has two outbox_retry inputs
// on one database: claims of one would starve the other's direct dispatch.
var ErrSecondDispatcher = errors.New("a stream may have one outbox_retry input per database")

func (h *Hub) setDispatcher(d *Dispatcher) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatcher != nil && h.dispatcher != d {
		return ErrSecondDispatcher
	}
	h.dispatcher = d
	return nil
}

func (h *Hub) dropDispatcher(d *Dispatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dispatcher == d {
		h.dispatcher = nil
	}
}

// Dispatcher returns the stream's dispatcher on this database, or nil.
func (h *Hub) Dispatcher() *Dispatcher {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dispatcher
}

// AttachOutput attaches the stream's output on this database. When a
// dispatcher is attached already, their settings are checked against each
// other; otherwise the dispatcher checks them when it attaches.
func (h *Hub) AttachOutput(o Output) error {
	h.mu.Lock()
	h.output = &o
	d := h.dispatcher
	h.mu.Unlock()
	if d != nil {
		return checkLease(d.cfg.Lease, o.Timeout)
	}
	return nil
}

// attached returns what the output attached, or nil.
func (h *Hub) attached() *Output {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.output
}

// checkLease refuses a lease that a request could outlive: with the lease
// renewed while the dispatcher runs, this bounds what a crash costs, and a
// shorter lease would give every claim of a crashed instance to another
// while its requests may still be under way.
func checkLease(lease, timeout time.Duration) error {
	if timeout >= lease {
		return fmt.Errorf("CLAIM_LEASE (outbox_retry lease, %v) must exceed FORWARD_TIMEOUT (http_forwarder timeout, %v): set CLAIM_LEASE to at least %v", lease, timeout, timeout+time.Second)
	}
	return nil
}

// gate is the attached output's platform protection, nil without one.
func (h *Hub) gate() *protection.Gate {
	if o := h.attached(); o != nil {
		return o.Protection
	}
	return nil
}
