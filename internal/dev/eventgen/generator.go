package eventgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures a Generator.
type Config struct {
	SourceConfig
	// Brokers are the Kafka seed brokers.
	Brokers []string
	// Rate is the number of messages per second; 0 produces as fast as Kafka
	// takes them.
	Rate float64
	// Count stops the generator after this many messages; 0 runs until the
	// context ends.
	Count int64
	// OnProduced, when set, is called with each message Kafka acknowledged
	// (err nil) or failed to take. Calls are serial and must return quickly.
	OnProduced func(m Message, err error)
	// ClientOpts are extra franz-go options (TLS, SASL, linger, ...).
	ClientOpts []kgo.Opt
}

// Stats count what a Generator produced. Only messages Kafka acknowledged
// are counted, Errors aside.
type Stats struct {
	// Produced counts every acknowledged message; Vehicle and Heartbeat
	// split it by kind.
	Produced, Vehicle, Heartbeat int64
	// Deliverable counts the messages the platform must receive once each:
	// good messages, including those without a messageId.
	Deliverable int64
	// Duplicates counts repeats of earlier good messages.
	Duplicates int64
	// Malformed counts the messages the forwarder must persist FAILED.
	Malformed int64
	// Errors counts messages Kafka did not take.
	Errors int64
}

// Rows is the number of outbox rows the acknowledged messages make: one per
// distinct key (duplicates add none).
func (s Stats) Rows() int64 { return s.Deliverable + s.Malformed }

// Generator produces camera messages to Kafka with franz-go.
type Generator struct {
	cfg    Config
	src    *Source
	client *kgo.Client

	produced, vehicle, heartbeat, deliverable, duplicates, malformed, errs atomic.Int64

	mu      sync.Mutex
	lastErr error
}

// New returns a Generator. It does not contact Kafka.
func New(cfg Config) (*Generator, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("eventgen: no Kafka brokers given")
	}
	if !(cfg.Rate >= 0) {
		return nil, fmt.Errorf("eventgen: rate %v is not a number of messages per second", cfg.Rate)
	}
	src, err := NewSource(cfg.SourceConfig)
	if err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("forwarder-eventgen"),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.RecordDeliveryTimeout(30 * time.Second),
	}, cfg.ClientOpts...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("eventgen: creating Kafka client: %w", err)
	}
	return &Generator{cfg: cfg, src: src, client: client}, nil
}

// Run produces messages until Count is reached or ctx ends, then waits up
// to 10 s for Kafka to acknowledge what is buffered. It returns nil when it
// stops for either reason, and an error only when no message at all could
// be produced.
func (g *Generator) Run(ctx context.Context) error {
	// Records carry their own context, cancelled only 10 s after ctx: what
	// is buffered when ctx ends still goes out (Flush below) instead of
	// failing as cancelled, and a blocked Produce is still released.
	recCtx, cancelRecs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRecs()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(10*time.Second, cancelRecs) })
	defer stopGrace()

	start := time.Now()
	var sent int64
	for g.cfg.Count == 0 || sent < g.cfg.Count {
		if g.cfg.Rate > 0 {
			// Pace by the schedule since start rather than per message, so
			// timer granularity costs no throughput at high rates.
			due := start.Add(time.Duration(float64(sent) / g.cfg.Rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
				case <-t.C:
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
		m := g.src.Next()
		sent++
		g.client.Produce(recCtx, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}, func(_ *kgo.Record, err error) {
			g.done(m, err)
		})
	}
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := g.client.Flush(flushCtx); err != nil {
		return fmt.Errorf("eventgen: flushing to Kafka: %w", err)
	}
	if st := g.Stats(); st.Produced == 0 && st.Errors > 0 {
		return fmt.Errorf("eventgen: Kafka took none of %d messages: %w", st.Errors, g.LastError())
	}
	return nil
}

func (g *Generator) done(m Message, err error) {
	if g.cfg.OnProduced != nil {
		g.cfg.OnProduced(m, err)
	}
	if err != nil {
		g.errs.Add(1)
		if !errors.Is(err, context.Canceled) {
			g.mu.Lock()
			g.lastErr = err
			g.mu.Unlock()
		}
		return
	}
	g.produced.Add(1)
	if m.Kind == Heartbeat {
		g.heartbeat.Add(1)
	} else {
		g.vehicle.Add(1)
	}
	switch {
	case m.Flaw == FlawDuplicate:
		g.duplicates.Add(1)
	case m.Malformed():
		g.malformed.Add(1)
	default:
		g.deliverable.Add(1)
	}
}

// Stats returns the counters so far.
func (g *Generator) Stats() Stats {
	return Stats{
		Produced:    g.produced.Load(),
		Vehicle:     g.vehicle.Load(),
		Heartbeat:   g.heartbeat.Load(),
		Deliverable: g.deliverable.Load(),
		Duplicates:  g.duplicates.Load(),
		Malformed:   g.malformed.Load(),
		Errors:      g.errs.Load(),
	}
}

// LastError is the last produce error other than a cancellation, or nil.
func (g *Generator) LastError() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// Close closes the Kafka client. Call it after Run has returned.
func (g *Generator) Close() { g.client.Close() }
