// Package mockplatform is a stand-in for the parking platform's HTTP API
// (mappings/README.md, docs/configuration.md#platform-responses), for the dev stack, the end-to-end tests and the
// benchmarks.
//
// It behaves like the real platform: the first request for a message_id is
// accepted with {"result":0}, every later one is answered as a duplicate
// {"result":1,"errcode":"4"}. Faults can be injected at configurable rates
// (errcode "998", errcode "999", HTTP 500, added latency) and switched on at
// will: Down answers 503 (with an optional Retry-After), Hang accepts
// requests and holds them unanswered until Release, Reject answers 998 and
// Fail HTTP 500 for chosen message_ids. It checks the credentials, counts everything, keeps
// every accepted delivery per message_id (with duplicates counted), keeps,
// on demand, every business request per berth in the order it was answered
// (to check per-berth ordering) and the most requests of each berth in
// flight at once (to check one at a time per berth), and measures the peak
// number of concurrent requests.
//
//	srv, err := mockplatform.Start(mockplatform.Config{AccessName: "dev", AccessPwd: pwd})
//	...
//	defer srv.Close()
//	// PLATFORM_URL=srv.URL
//	err = srv.WaitFor(ctx, func(s mockplatform.Stats) bool { return s.Accepted >= 100 })
package mockplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forwarder/forwarder/internal/dev/shares"
)

// The platform's endpoints.
const (
	PathBusiness  = "/mch/business"
	PathHeartbeat = "/mch/heartbeat"
)

// Platform errcodes the mock answers with.
const (
	ErrcodeDuplicate = "4"   // already delivered: the forwarder counts it as SUCCESS
	ErrcodeRejected  = "998" // do not resend: FAILED at once
	ErrcodeBusy      = "999" // transient: retried
)

// maxBody matches the largest message the forwarder consumes.
const maxBody = 16 << 20

// requiredFields are the request fields the mappings always send; a request
// without one of them is answered 400, so a mapping bug shows up as errors.
var requiredFields = map[string][]string{
	PathBusiness:  {"message_id", "device_id", "park_code", "berth_code", "plate_no", "enter_state", "event_time", "credibility", "pictures"},
	PathHeartbeat: {"message_id", "device_id", "park_code", "berth_code", "capture_time", "pic_type", "pic_url"},
}

// Faults are the injected failures. Rates are probabilities per request in
// [0, 1], rolled independently of the message; their sum must not exceed 1.
type Faults struct {
	// Errcode998 answers HTTP 200 {"result":1,"errcode":"998"} (do not resend).
	Errcode998 float64
	// Errcode999 answers HTTP 200 {"result":1,"errcode":"999"} (busy, retry).
	Errcode999 float64
	// HTTP5xx answers HTTP 500 with a non-JSON body.
	HTTP5xx float64
	// Latency is added to every answer, plus a uniform random part up to
	// LatencyJitter.
	Latency, LatencyJitter time.Duration
	// FirstTry999 answers the first request of a message_id errcode 999
	// (busy, retry) with this probability, rolled once per message_id; its
	// later requests are not affected. A platform that fails a share of
	// first attempts transiently.
	FirstTry999 float64
}

// Validate checks the faults: each share from 0 to 1, the answers they
// replace at most every answer, no negative latency. Its errors call a field
// name(field), e.g. the flag that set it; nil keeps the Go names.
func (f Faults) Validate(name func(field string) string) error {
	if name == nil {
		name = func(field string) string { return field }
	}
	err := shares.Validate("answer", name,
		shares.Share{Field: "Errcode998", Value: f.Errcode998, Exclusive: true},
		shares.Share{Field: "Errcode999", Value: f.Errcode999, Exclusive: true},
		shares.Share{Field: "HTTP5xx", Value: f.HTTP5xx, Exclusive: true},
		shares.Share{Field: "FirstTry999", Value: f.FirstTry999})
	if err != nil {
		return err
	}
	if f.Latency < 0 || f.LatencyJitter < 0 {
		return fmt.Errorf("%s %s, %s %s: a latency is not negative", name("Latency"), f.Latency, name("LatencyJitter"), f.LatencyJitter)
	}
	return nil
}

// Config configures a Platform.
type Config struct {
	// AccessName and AccessPwd are the credentials every request must carry
	// in its access_name and access_pwd fields; a mismatch is answered 401.
	// Empty AccessName disables the check.
	AccessName, AccessPwd string
	// Faults are the initial injected failures (see SetFaults).
	Faults Faults
	// Seed makes the fault rolls reproducible; 0 picks a random seed.
	Seed uint64
	// RecordBodies keeps the body of each message_id's first accepted
	// request (Delivery.Body). Off, memory stays small for benchmarks.
	RecordBodies bool
	// NumericErrcode sends errcode as a JSON number instead of a string
	// (the real platform has been seen doing both).
	NumericErrcode bool
	// RecordBerths keeps every business request per berth (park_code +
	// "/" + berth_code), in the order they were answered (BerthLog), and
	// the most requests of each berth in flight at once (BerthInFlightPeaks).
	RecordBerths bool
}

// Stats are the platform's counters since New or Reset.
type Stats struct {
	// Requests counts every request received.
	Requests int64
	// Accepted counts first deliveries (answered result 0): the number of
	// distinct message_ids delivered. Business and Heartbeat split it by path.
	Accepted, Business, Heartbeat int64
	// Duplicates counts repeat deliveries (answered errcode "4").
	Duplicates int64
	// Errcode998, Errcode999 and HTTP5xx count injected faults.
	Errcode998, Errcode999, HTTP5xx int64
	// Unavailable counts 503 (or SetDownWith's status) answers while Down.
	Unavailable int64
	// Hung counts requests held by Hang.
	Hung int64
	// AuthFailures counts requests with wrong or missing credentials (401).
	AuthFailures int64
	// BadRequests counts wrong methods, unknown paths, bodies that are not a
	// JSON object, and missing required fields (4xx).
	BadRequests int64
	// InFlight is the number of requests being handled now; PeakInFlight the
	// most there have been at once.
	InFlight, PeakInFlight int64
}

// Delivery is what the platform saw of one message_id.
type Delivery struct {
	MessageID string
	// Path of the first accepted request.
	Path string
	// Count is the number of accepted requests: 1 plus the duplicates.
	Count int
	// FirstAt and LastAt are the times of the first and last accepted request.
	FirstAt, LastAt time.Time
	// Body of the first accepted request, when Config.RecordBodies is set.
	Body json.RawMessage
}

// Platform is the mock platform, an http.Handler. It is safe for concurrent
// use, and its switches may be flipped while requests are in flight.
type Platform struct {
	cfg Config

	requests, business, heartbeat, duplicates         atomic.Int64
	err998, err999, err5xx, unavailable, hung         atomic.Int64
	authFailures, badRequests, inFlight, peakInFlight atomic.Int64

	mu         sync.Mutex
	faults     Faults
	rng        *rand.Rand
	down       bool
	downStatus int
	retryAfter time.Duration
	hang       chan struct{} // non-nil while hanging; closed by Release
	deliveries map[string]*Delivery
	changed    chan struct{} // closed and replaced when a counter moves
	rejected   map[string]bool
	// failing holds the message_ids answered HTTP 500 (Fail), with the
	// number of such answers left (-1: every one).
	failing map[string]int
	// tried holds the message_ids that had a request (for FirstTry999).
	tried  map[string]bool
	berths map[string][]BerthRequest
	// berthInFlight counts each berth's business requests being handled,
	// from the moment the berth is read until the answer is written;
	// berthPeak is the most there have been at once (RecordBerths).
	berthInFlight, berthPeak map[string]int
}

// Outcomes of a request in a berth's log.
const (
	OutcomeAccepted  = "accepted"
	OutcomeDuplicate = "duplicate"
	OutcomeRejected  = "998"
	OutcomeBusy      = "999"
	OutcomeHTTP5xx   = "500"
)

// BerthRequest is one business request of a berth, as answered.
type BerthRequest struct {
	MessageID string
	// Outcome is OutcomeAccepted, OutcomeDuplicate, OutcomeRejected,
	// OutcomeBusy or OutcomeHTTP5xx.
	Outcome string
	At      time.Time
}

// New returns a platform. It panics on invalid fault rates, a programming
// error; use SetFaults to validate input.
func New(cfg Config) *Platform {
	if err := cfg.Faults.Validate(nil); err != nil {
		panic("mockplatform: " + err.Error())
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Platform{
		cfg:        cfg,
		faults:     cfg.Faults,
		rng:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		deliveries: map[string]*Delivery{},
		changed:    make(chan struct{}),
		rejected:   map[string]bool{},
		failing:    map[string]int{},
		tried:      map[string]bool{},
		berths:     map[string][]BerthRequest{},

		berthInFlight: map[string]int{},
		berthPeak:     map[string]int{},
	}
}

// Reject answers every request for these message_ids errcode 998 (do not
// resend), until Accept. They count in Errcode998.
func (p *Platform) Reject(messageIDs ...string) {
	p.mu.Lock()
	for _, id := range messageIDs {
		p.rejected[id] = true
	}
	p.mu.Unlock()
}

// Fail answers the next times requests for each of these message_ids HTTP
// 500 with a non-JSON body (every request when times < 0, until Accept),
// while other messages are served: a platform that cannot handle some
// messages (a payload it chokes on) or fails them for a while. They count
// in HTTP5xx.
func (p *Platform) Fail(times int, messageIDs ...string) {
	p.mu.Lock()
	for _, id := range messageIDs {
		p.failing[id] = times
	}
	p.mu.Unlock()
}

// Accept ends Reject and Fail for these message_ids.
func (p *Platform) Accept(messageIDs ...string) {
	p.mu.Lock()
	for _, id := range messageIDs {
		delete(p.rejected, id)
		delete(p.failing, id)
	}
	p.mu.Unlock()
}

// BerthLog returns the business requests of every berth (with
// Config.RecordBerths), each berth's in the order they were answered.
func (p *Platform) BerthLog() map[string][]BerthRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]BerthRequest, len(p.berths))
	for b, rs := range p.berths {
		out[b] = append([]BerthRequest(nil), rs...)
	}
	return out
}

// BerthInFlightPeaks returns, for every berth that had a business request
// (with Config.RecordBerths), the most of its requests the platform was
// handling at once: each arriving request counts those of its berth not yet
// answered, itself included. 1 means its requests came one at a time.
func (p *Platform) BerthInFlightPeaks() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.berthPeak))
	for b, n := range p.berthPeak {
		out[b] = n
	}
	return out
}

// berthArrived counts a business request of berth in flight and returns
// the function that counts it answered.
func (p *Platform) berthArrived(berth string) (answered func()) {
	p.mu.Lock()
	p.berthInFlight[berth]++
	p.berthPeak[berth] = max(p.berthPeak[berth], p.berthInFlight[berth])
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		if p.berthInFlight[berth]--; p.berthInFlight[berth] == 0 {
			delete(p.berthInFlight, berth)
		}
		p.mu.Unlock()
	}
}

// noteBerth adds a business request's answer to its berth's log; p.mu is
// held.
func (p *Platform) noteBerth(berth, id, outcome string, at time.Time) {
	if p.cfg.RecordBerths && berth != "" {
		p.berths[berth] = append(p.berths[berth], BerthRequest{MessageID: id, Outcome: outcome, At: at})
	}
}

// SetFaults replaces the injected failures.
func (p *Platform) SetFaults(f Faults) error {
	if err := f.Validate(nil); err != nil {
		return fmt.Errorf("mockplatform: %w", err)
	}
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
	return nil
}

// Faults returns the injected failures in force.
func (p *Platform) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// SetDown switches the outage on or off. While down every request is
// answered 503, with a Retry-After header of retryAfter (rounded up to whole
// seconds) when it is positive.
func (p *Platform) SetDown(down bool, retryAfter time.Duration) {
	p.SetDownWith(down, http.StatusServiceUnavailable, retryAfter)
}

// SetDownWith is SetDown answering status instead of 503 (429 for an
// overloaded platform).
func (p *Platform) SetDownWith(down bool, status int, retryAfter time.Duration) {
	p.mu.Lock()
	p.down, p.downStatus, p.retryAfter = down, status, retryAfter
	p.mu.Unlock()
}

// Hang makes the platform accept requests and never answer them until
// Release (or until the client gives up).
func (p *Platform) Hang() {
	p.mu.Lock()
	if p.hang == nil {
		p.hang = make(chan struct{})
	}
	p.mu.Unlock()
}

// Release ends Hang: the held requests are then handled normally.
func (p *Platform) Release() {
	p.mu.Lock()
	if p.hang != nil {
		close(p.hang)
		p.hang = nil
	}
	p.mu.Unlock()
}

// Stats returns the counters.
func (p *Platform) Stats() Stats {
	s := Stats{
		Requests:     p.requests.Load(),
		Business:     p.business.Load(),
		Heartbeat:    p.heartbeat.Load(),
		Duplicates:   p.duplicates.Load(),
		Errcode998:   p.err998.Load(),
		Errcode999:   p.err999.Load(),
		HTTP5xx:      p.err5xx.Load(),
		Unavailable:  p.unavailable.Load(),
		Hung:         p.hung.Load(),
		AuthFailures: p.authFailures.Load(),
		BadRequests:  p.badRequests.Load(),
		InFlight:     p.inFlight.Load(),
		PeakInFlight: p.peakInFlight.Load(),
	}
	s.Accepted = s.Business + s.Heartbeat
	return s
}

// Delivery returns what was delivered for messageID.
func (p *Platform) Delivery(messageID string) (Delivery, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.deliveries[messageID]
	if !ok {
		return Delivery{}, false
	}
	return *d, true
}

// Deliveries returns every delivery, in order of first acceptance.
func (p *Platform) Deliveries() []Delivery {
	p.mu.Lock()
	out := make([]Delivery, 0, len(p.deliveries))
	for _, d := range p.deliveries {
		out = append(out, *d)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].FirstAt.Equal(out[j].FirstAt) {
			return out[i].FirstAt.Before(out[j].FirstAt)
		}
		return out[i].MessageID < out[j].MessageID
	})
	return out
}

// Reset forgets every delivery and zeroes the counters (InFlight, and each
// berth's requests in flight, aside).
// The switches and faults stay as they are.
func (p *Platform) Reset() {
	p.mu.Lock()
	p.deliveries = map[string]*Delivery{}
	p.tried = map[string]bool{}
	p.berths = map[string][]BerthRequest{}
	p.berthPeak = map[string]int{}
	for b, n := range p.berthInFlight {
		p.berthPeak[b] = n
	}
	p.mu.Unlock()
	for _, c := range []*atomic.Int64{&p.requests, &p.business, &p.heartbeat, &p.duplicates, &p.err998,
		&p.err999, &p.err5xx, &p.unavailable, &p.hung, &p.authFailures, &p.badRequests} {
		c.Store(0)
	}
	p.peakInFlight.Store(p.inFlight.Load())
	p.notify()
}

// WaitFor blocks until cond holds for the counters or ctx ends. cond is
// evaluated at once, when a request arrives, when one is held by Hang and
// after every answer.
func (p *Platform) WaitFor(ctx context.Context, cond func(Stats) bool) error {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if cond(p.Stats()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the mock platform (now %+v): %w", p.Stats(), ctx.Err())
		case <-ch:
		}
	}
}

func (p *Platform) notify() {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// ServeHTTP handles one platform request.
func (p *Platform) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.inFlight.Add(1)
	for peak := p.peakInFlight.Load(); n > peak && !p.peakInFlight.CompareAndSwap(peak, n); peak = p.peakInFlight.Load() {
	}
	defer func() {
		p.inFlight.Add(-1)
		p.notify()
	}()
	p.requests.Add(1)
	p.notify()

	// The body is read first: only then does net/http watch the connection
	// and cancel r.Context() when the client gives up on a held request.
	body, readErr := io.ReadAll(io.LimitReader(r.Body, maxBody+1))

	p.mu.Lock()
	hang, down, downStatus, retryAfter := p.hang, p.down, p.downStatus, p.retryAfter
	p.mu.Unlock()
	if hang != nil {
		p.hung.Add(1)
		p.notify()
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
		p.mu.Lock()
		down, downStatus, retryAfter = p.down, p.downStatus, p.retryAfter
		p.mu.Unlock()
	}
	if down {
		p.unavailable.Add(1)
		if retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
		}
		http.Error(w, http.StatusText(downStatus), downStatus)
		return
	}

	if _, ok := requiredFields[r.URL.Path]; !ok {
		p.badRequests.Add(1)
		p.answer(w, http.StatusNotFound, "404", "no such endpoint "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		p.badRequests.Add(1)
		p.answer(w, http.StatusMethodNotAllowed, "405", "use POST")
		return
	}
	if readErr != nil {
		p.badRequests.Add(1)
		p.answer(w, http.StatusBadRequest, "400", "reading body: "+readErr.Error())
		return
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil || req == nil || len(body) > maxBody {
		p.badRequests.Add(1)
		p.answer(w, http.StatusBadRequest, "400", "body is not a JSON object")
		return
	}
	if p.cfg.AccessName != "" && (req["access_name"] != p.cfg.AccessName || req["access_pwd"] != p.cfg.AccessPwd) {
		p.authFailures.Add(1)
		p.answer(w, http.StatusUnauthorized, "401", "access_name or access_pwd is wrong")
		return
	}
	for _, f := range requiredFields[r.URL.Path] {
		if v, ok := req[f]; !ok || v == nil || v == "" {
			p.badRequests.Add(1)
			p.answer(w, http.StatusBadRequest, "400", "missing field "+f)
			return
		}
	}
	id, ok := req["message_id"].(string)
	if !ok {
		p.badRequests.Add(1)
		p.answer(w, http.StatusBadRequest, "400", "message_id is not a string")
		return
	}

	var berth string
	if r.URL.Path == PathBusiness {
		park, _ := req["park_code"].(string)
		code, _ := req["berth_code"].(string)
		berth = park + "/" + code
		if p.cfg.RecordBerths {
			// Deferred, so counted answered before net/http sends the
			// reply: the next request of the berth, which a forwarder sends
			// only once it has the reply, never overlaps it here.
			defer p.berthArrived(berth)()
		}
	}

	p.mu.Lock()
	f := p.faults
	roll := p.rng.Float64()
	var jitter time.Duration
	if f.LatencyJitter > 0 {
		jitter = time.Duration(p.rng.Int64N(int64(f.LatencyJitter)))
	}
	rejected := p.rejected[id]
	fails := false
	if left, ok := p.failing[id]; ok && left != 0 {
		fails = true
		if left > 0 {
			p.failing[id] = left - 1
		}
	}
	var firstTryFails bool
	if f.FirstTry999 > 0 { // remembering the ids tried costs memory: only when asked
		firstTryFails = !p.tried[id] && p.rng.Float64() < f.FirstTry999
		p.tried[id] = true
	}
	p.mu.Unlock()
	failed := func(outcome string) {
		p.mu.Lock()
		p.noteBerth(berth, id, outcome, time.Now())
		p.mu.Unlock()
	}
	if d := f.Latency + jitter; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	switch {
	case rejected || roll < f.Errcode998:
		p.err998.Add(1)
		failed(OutcomeRejected)
		p.answer(w, http.StatusOK, ErrcodeRejected, "do not resend")
		return
	case firstTryFails || roll < f.Errcode998+f.Errcode999:
		p.err999.Add(1)
		failed(OutcomeBusy)
		p.answer(w, http.StatusOK, ErrcodeBusy, "system busy, try again later")
		return
	case fails || roll < f.Errcode998+f.Errcode999+f.HTTP5xx:
		p.err5xx.Add(1)
		failed(OutcomeHTTP5xx)
		http.Error(w, "internal server error", http.StatusInternalServerError)
		return
	}

	now := time.Now()
	p.mu.Lock()
	d, seen := p.deliveries[id]
	if seen {
		d.Count++
		d.LastAt = now
	} else {
		d = &Delivery{MessageID: id, Path: r.URL.Path, Count: 1, FirstAt: now, LastAt: now}
		if p.cfg.RecordBodies {
			d.Body = body
		}
		p.deliveries[id] = d
	}
	outcome := OutcomeAccepted
	if seen {
		outcome = OutcomeDuplicate
	}
	p.noteBerth(berth, id, outcome, now)
	p.mu.Unlock()
	if seen {
		p.duplicates.Add(1)
		p.answer(w, http.StatusOK, ErrcodeDuplicate, "duplicate message_id")
		return
	}
	if r.URL.Path == PathBusiness {
		p.business.Add(1)
	} else {
		p.heartbeat.Add(1)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"result":0,"errmsg":"success"}`)
}

// answer writes a platform error: {"result":1,"errcode":...,"errmsg":...}.
func (p *Platform) answer(w http.ResponseWriter, status int, errcode, msg string) {
	var code any = errcode
	if p.cfg.NumericErrcode {
		if n, err := strconv.Atoi(errcode); err == nil {
			code = n
		}
	}
	b, _ := json.Marshal(map[string]any{"result": 1, "errcode": code, "errmsg": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Server is a Platform listening on a loopback port.
type Server struct {
	*Platform
	// URL is the base URL, for PLATFORM_URL (http://127.0.0.1:port).
	URL string
	// Addr is the listening address (127.0.0.1:port).
	Addr string

	srv  *http.Server
	done chan error
}

// Start serves a new Platform on a free loopback port.
func Start(cfg Config) (*Server, error) { return StartAt("127.0.0.1:0", cfg) }

// StartAt serves a new Platform on addr.
func StartAt(addr string, cfg Config) (*Server, error) {
	if err := cfg.Faults.Validate(nil); err != nil {
		return nil, fmt.Errorf("mockplatform: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mockplatform: listening on %s: %w", addr, err)
	}
	p := New(cfg)
	s := &Server{
		Platform: p,
		Addr:     ln.Addr().String(),
		URL:      "http://" + ln.Addr().String(),
		srv:      &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second},
		done:     make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Close releases hung requests, stops accepting, and waits up to 5 s for the
// requests in flight to be answered before dropping them.
func (s *Server) Close() error {
	s.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
