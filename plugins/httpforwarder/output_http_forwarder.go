// Package httpforwarder holds the http_forwarder output: it POSTs claimed
// outbox rows to the parking platform, classifies each reply with expr rules
// and records every outcome in PostgreSQL, fenced by the row's claim.
//
// The output is an adapter: spec.go and config.go are its configuration,
// transport.go makes the requests (credentials, timeouts, reading and
// redacting replies), outcome.go decides what a claim and its reply mean
// (pure), the platform's protection (internal/protection) admits each
// request, and the stream's claim engine (internal/dispatch) knows the
// leases and records the results.
package httpforwarder

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/trace"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/lograte"
	"github.com/forwarder/forwarder/internal/metricseries"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/protection"
	"github.com/forwarder/forwarder/internal/tracectx"
)

// maxResultsPerStatement caps one result write gathering the outcomes of
// concurrent batches.
const maxResultsPerStatement = 1000

// Reasons a claim goes back unsent, as counted.
const (
	returnedLease    = "lease"
	returnedStopping = "stopping"
	returnedLost     = "lost"
	returnedBreaker  = "breaker"
)

func init() {
	// The spec's lint rules call these methods: they must exist before the
	// spec is built.
	if err := registerLintMethods(); err != nil {
		panic(err)
	}
	service.MustRegisterBatchOutput("http_forwarder", httpForwarderSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			out, err := newHTTPForwarderFromParsed(conf, mgr)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			// As many concurrent batches as request slots: single-message
			// batches still fill every slot. The gate's concurrency limit,
			// not the engine, bounds the requests.
			return out, out.batching, out.maxInFlight, nil
		})
}

// httpForwarder is the http_forwarder output.
type httpForwarder struct {
	log *service.Logger
	hub *dispatch.Hub
	// tracer starts the platform.request span of each traced message; nil
	// when the stream does not trace.
	tracer trace.Tracer

	url     *service.InterpolatedString
	headers map[string]*service.InterpolatedString
	// staticHeader is shared by every request when no header is
	// interpolated (the client never changes a request's headers).
	staticHeader http.Header

	batching    service.BatchPolicy
	maxInFlight int

	policy    policy
	transport *transport
	gate      *protection.Gate
	returns   *lograte.Burst

	connMu   sync.Mutex
	pool     atomic.Pointer[pgxpool.Pool]
	recorder atomic.Pointer[dispatch.Recorder]

	mAttempts      *service.MetricCounter
	mLatency       *service.MetricTimer
	mEndToEnd      *service.MetricTimer
	mMappingErrors *service.MetricCounter
	mReturned      *service.MetricCounter
}

// newHTTPForwarderFromParsed parses the output's config (config.go) and
// builds the output. Nothing touches the network.
func newHTTPForwarderFromParsed(conf *service.ParsedConfig, mgr *service.Resources) (*httpForwarder, error) {
	c, err := parseConfig(conf)
	if err != nil {
		return nil, err
	}
	h := &httpForwarder{log: mgr.Logger(), url: c.url, headers: c.headers, policy: c.policy,
		batching: c.batching, maxInFlight: c.maxInFlight, tracer: tracectx.Tracer(mgr)}
	h.staticHeader = http.Header{"Content-Type": {"application/json"}}
	for k, v := range h.headers {
		s, ok := v.Static()
		if !ok {
			h.staticHeader = nil
			break
		}
		h.staticHeader.Set(k, s)
	}
	h.transport = newTransport(c.policy.timeout, c.maxInFlight, c.tls, c.accessName, c.accessPwd)
	h.transport.copyHeaders = h.policy.rules.usesHeaders
	// The URL as a message without metadata would have it: enough to see
	// the scheme and host, which per-message interpolation rarely changes.
	if u, err := h.url.TryString(service.NewMessage(nil)); err == nil {
		if host := cleartextHost(u); host != "" {
			h.log.Warnf("the platform URL is plain http:// to %s: access_name and access_pwd go over the network unencrypted in every request; use https://", host)
		}
	}

	m := mgr.Metrics()
	h.mAttempts = m.NewCounter("forwarder_attempts_total", "api_type", "outcome")
	h.mLatency = m.NewTimer("forwarder_forward_latency_seconds", "api_type")
	h.mEndToEnd = m.NewTimer("forwarder_end_to_end_latency_seconds", "api_type")
	h.mMappingErrors = m.NewCounter("forwarder_mapping_errors_total", "api_type")
	h.mReturned = m.NewCounter("forwarder_claims_returned_total", "reason")
	probes := m.NewCounter("forwarder_platform_probes_total", "result")
	// Every series at 0 from the start (internal/metricseries).
	apiTypes := metricseries.Product([]string{outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat})
	metricseries.Counter(h.mAttempts, metricseries.Product([]string{outboxdb.APITypeVehicleEvent, outboxdb.APITypeHeartbeat}, outcomes)...)
	metricseries.Timer(h.mLatency, apiTypes...)
	metricseries.Timer(h.mEndToEnd, apiTypes...)
	metricseries.Counter(h.mMappingErrors, apiTypes...)
	metricseries.Counter(h.mReturned, metricseries.Product([]string{returnedLease, returnedStopping, returnedLost, returnedBreaker})...)
	metricseries.Counter(probes, metricseries.Product([]string{"healthy", "unavailable", "inconclusive"})...)
	h.gate = protection.NewGate(c.gate, h.log, protection.Metrics{
		State:        m.NewGauge("forwarder_platform_breaker_state"),
		Limit:        m.NewGauge("forwarder_platform_concurrency_limit"),
		Free:         m.NewGauge("forwarder_semaphore_available_permits"),
		Probes:       probes,
		Paused:       m.NewGauge("forwarder_delivery_paused"),
		PauseStarted: m.NewGauge("forwarder_delivery_pause_started_timestamp_seconds"),
		PauseEnd:     m.NewGauge("forwarder_delivery_pause_end_timestamp_seconds"),
	})
	h.returns = lograte.New(h.log, 10*time.Second)

	if h.hub, err = dispatch.HubFromParsed(conf, mgr); err != nil {
		return nil, err
	}
	// The stream's claim engine checks its lease against the timeout, uses
	// these attempts and claims only what the gate lets through.
	if err := h.hub.AttachOutput(dispatch.Output{Timeout: c.policy.timeout, MaxAttempts: c.policy.maxAttempts, Protection: h.gate}); err != nil {
		return nil, err
	}
	return h, nil
}

// Connect takes the stream's pool for this database (creating or upgrading
// the schema); it is safe to call again.
func (h *httpForwarder) Connect(ctx context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if h.pool.Load() != nil {
		return nil
	}
	pool, err := h.hub.Open(ctx)
	if err != nil {
		return err
	}
	rec := dispatch.NewRecorder(func(ctx context.Context, results []outboxdb.Result) ([]int64, error) {
		// With the stream's ordering policy (the dispatcher's
		// order_on_failed), handing the rows it releases to the dispatcher.
		ids, err := dispatch.RecordResults(ctx, pool, h.hub.Dispatcher(), results)
		return ids, outboxdb.WhenReadOnly(pool, err)
	}, maxResultsPerStatement)
	rec.OnRetry = func(n int, err error) {
		h.log.Warnf("Recording %d forward results failed, retrying until their claims expire: %v", n, err)
	}
	h.recorder.Store(rec)
	if err := h.gate.Start(ctx, pool); err != nil {
		h.hub.Release()
		return err
	}
	h.pool.Store(pool)
	return nil
}

// WriteBatch sends the batch's messages concurrently, each admitted by the
// gate, then records every outcome in one statement. It returns nil once
// the outcomes are recorded, whatever they are; an error when the database
// write fails; and a batch error for messages that carry no claim metadata
// (they cannot be recorded, so they are nacked).
func (h *httpForwarder) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	rec := h.recorder.Load()
	if rec == nil {
		return service.ErrNotConnected
	}
	var batchErr *service.BatchError
	atts := make([]*attempt, 0, len(batch))
	seen := make(map[int64]struct{}, len(batch))
	for i, msg := range batch {
		c, err := msgmeta.ReadClaim(msg)
		if err == nil {
			if _, dup := seen[c.ID]; dup {
				err = fmt.Errorf("outbox row %d appears twice in one batch", c.ID)
			}
			seen[c.ID] = struct{}{}
		}
		if err != nil {
			if batchErr == nil {
				// The nack's error becomes the row's last_error: it
				// says why, from the first such message.
				batchErr = service.NewBatchError(batch, fmt.Errorf("http_forwarder: messages without a valid outbox claim cannot be forwarded: %w", err))
			}
			batchErr.Failed(i, err)
			continue
		}
		a := &attempt{claim: c}
		if h.tracer != nil {
			a.trace = msg.Context()
		}
		h.prepare(a, msg)
		atts = append(atts, a)
	}

	d := h.hub.Dispatcher()
	var wg sync.WaitGroup
	for _, a := range atts {
		if a.done {
			continue
		}
		ticket, err := h.gate.Admit(ctx, a.claim.ID)
		switch {
		case errors.Is(err, protection.ErrDenied):
			h.giveBack(a, returnedBreaker, "not sent: the platform is down (circuit breaker open) or asked to pause")
			continue
		case err != nil:
			h.giveBack(a, returnedStopping, "not sent: the output is stopping")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.send(ctx, d, a, ticket)
		}()
	}
	wg.Wait()

	if err := h.record(ctx, rec, d, atts); err != nil {
		return err
	}
	if batchErr != nil {
		return batchErr
	}
	return nil
}

// Close releases the pool and idle connections.
func (h *httpForwarder) Close(context.Context) error {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if rec := h.recorder.Swap(nil); rec != nil {
		rec.Close()
	}
	if h.pool.Swap(nil) != nil {
		h.gate.Stop()
		h.hub.Release()
	}
	h.transport.close()
	h.returns.Flush()
	return nil
}
