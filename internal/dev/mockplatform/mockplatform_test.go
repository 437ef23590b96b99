package mockplatform_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	name = "dev"
	pwd  = "secret-pwd"
)

type testBundle struct {
	srv    *mockplatform.Server
	client *http.Client
}

func setup(t *testing.T, cfg mockplatform.Config) *testBundle {
	t.Helper()
	if cfg.AccessName == "" {
		cfg.AccessName, cfg.AccessPwd = name, pwd
	}
	srv, err := mockplatform.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
		tr.CloseIdleConnections()
	})
	return &testBundle{srv: srv, client: &http.Client{Transport: tr}}
}

// reply is a platform answer.
type reply struct {
	Status     int
	RetryAfter string
	Result     any    `json:"result"`
	Errcode    any    `json:"errcode"`
	Raw        string `json:"-"`
}

func vehicle(id string) map[string]any {
	return map[string]any{
		"access_name": name, "access_pwd": pwd, "message_id": id, "device_id": "CAM-0001",
		"park_code": "P1001", "berth_code": "B-012", "item_id": "73421", "plate_no": "粤B12345",
		"plate_color": "1", "enter_state": "1", "event_time": "2026-05-21 10:30:00", "credibility": "85",
		"pictures": []any{map[string]any{"pic_type": "1", "pic_url": "/a.jpg"}},
	}
}

func heartbeat(id string) map[string]any {
	return map[string]any{
		"access_name": name, "access_pwd": pwd, "message_id": id, "device_id": "CAM-0001",
		"park_code": "P1001", "berth_code": "B-012", "capture_time": "2026-05-21 10:35:00",
		"pic_type": "0", "pic_url": "/hb.jpg",
	}
}

func (b *testBundle) post(ctx context.Context, t *testing.T, path string, body any) (reply, error) {
	t.Helper()
	var raw []byte
	switch v := body.(type) {
	case string:
		raw = []byte(v)
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Raw: string(data)}
	_ = json.Unmarshal(data, &r)
	return r, nil
}

func (b *testBundle) mustPost(t *testing.T, path string, body any) reply {
	t.Helper()
	r, err := b.post(context.Background(), t, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPlatform(t *testing.T) {
	t.Parallel()

	t.Run("FirstAcceptedThenDuplicate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{RecordBodies: true})
		for i, want := range []reply{{Status: 200, Result: 0.0}, {Status: 200, Result: 1.0, Errcode: "4"}, {Status: 200, Result: 1.0, Errcode: "4"}} {
			got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1"))
			if got.Status != want.Status || got.Result != want.Result || got.Errcode != want.Errcode {
				t.Errorf("request %d: %+v, want %+v", i+1, got, want)
			}
		}
		if got := b.mustPost(t, mockplatform.PathHeartbeat, heartbeat("h1")); got.Status != 200 || got.Result != 0.0 {
			t.Errorf("heartbeat: %+v, want accepted", got)
		}
		st := b.srv.Stats()
		if st.Requests != 4 || st.Accepted != 2 || st.Business != 1 || st.Heartbeat != 1 || st.Duplicates != 2 {
			t.Errorf("stats %+v", st)
		}
		d, ok := b.srv.Delivery("v1")
		if !ok || d.Count != 3 || d.Path != mockplatform.PathBusiness || !strings.Contains(string(d.Body), `"plate_no":"粤B12345"`) {
			t.Errorf("delivery v1 = %+v, %v", d, ok)
		}
		if ds := b.srv.Deliveries(); len(ds) != 2 || ds[0].MessageID != "v1" || ds[1].MessageID != "h1" {
			t.Errorf("deliveries %+v, want v1 then h1", ds)
		}
	})

	t.Run("FailsChosenMessages", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.srv.Fail(-1, "always")
		b.srv.Fail(2, "twice")
		for i := range 3 {
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("always")); got.Status != http.StatusInternalServerError {
				t.Errorf("request %d of a message failed always: %+v, want 500", i+1, got)
			}
			want := http.StatusInternalServerError
			if i == 2 {
				want = http.StatusOK
			}
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("twice")); got.Status != want {
				t.Errorf("request %d of a message failed twice: %+v, want %d", i+1, got, want)
			}
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle(fmt.Sprintf("other-%d", i))); got.Status != http.StatusOK || got.Result != 0.0 {
				t.Errorf("another message: %+v, want accepted", got)
			}
		}
		b.srv.Accept("always")
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("always")); got.Status != http.StatusOK {
			t.Errorf("after Accept: %+v, want accepted", got)
		}
		if st := b.srv.Stats(); st.HTTP5xx != 5 || st.Accepted != 5 {
			t.Errorf("stats %+v, want 5 HTTP 500s and 5 accepted", st)
		}
	})

	t.Run("ChecksCredentials", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		bad := vehicle("v1")
		bad["access_pwd"] = "wrong"
		missing := heartbeat("h1")
		delete(missing, "access_name")
		for _, c := range []struct {
			path string
			body map[string]any
		}{{mockplatform.PathBusiness, bad}, {mockplatform.PathHeartbeat, missing}} {
			if got := b.mustPost(t, c.path, c.body); got.Status != http.StatusUnauthorized {
				t.Errorf("%s: %+v, want 401", c.path, got)
			}
		}
		if st := b.srv.Stats(); st.AuthFailures != 2 || st.Accepted != 0 {
			t.Errorf("stats %+v, want 2 auth failures and nothing accepted", st)
		}
		if _, ok := b.srv.Delivery("v1"); ok {
			t.Error("a request with a wrong password was recorded as delivered")
		}
	})

	t.Run("RejectsBadRequests", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		noPlate := vehicle("v1")
		delete(noPlate, "plate_no")
		emptyURL := heartbeat("h1")
		emptyURL["pic_url"] = ""
		numericID := heartbeat("h2")
		numericID["message_id"] = 7
		for _, c := range []struct {
			path   string
			body   any
			status int
		}{
			{"/mch/other", vehicle("v2"), http.StatusNotFound},
			{mockplatform.PathBusiness, "not json", http.StatusBadRequest},
			{mockplatform.PathBusiness, "[1,2]", http.StatusBadRequest},
			{mockplatform.PathBusiness, "null", http.StatusBadRequest},
			{mockplatform.PathBusiness, noPlate, http.StatusBadRequest},
			{mockplatform.PathHeartbeat, emptyURL, http.StatusBadRequest},
			{mockplatform.PathHeartbeat, numericID, http.StatusBadRequest},
		} {
			if got := b.mustPost(t, c.path, c.body); got.Status != c.status {
				t.Errorf("POST %s %v: %d %s, want %d", c.path, c.body, got.Status, got.Raw, c.status)
			}
		}
		resp, err := b.client.Get(b.srv.URL + mockplatform.PathBusiness)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET: %d, want 405", resp.StatusCode)
		}
		if st := b.srv.Stats(); st.BadRequests != 8 || st.Accepted != 0 {
			t.Errorf("stats %+v, want 8 bad requests", st)
		}
	})

	t.Run("InjectsEachFault", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			faults mockplatform.Faults
			want   reply
			count  func(mockplatform.Stats) int64
		}{
			{mockplatform.Faults{Errcode998: 1}, reply{Status: 200, Result: 1.0, Errcode: "998"}, func(s mockplatform.Stats) int64 { return s.Errcode998 }},
			{mockplatform.Faults{Errcode999: 1}, reply{Status: 200, Result: 1.0, Errcode: "999"}, func(s mockplatform.Stats) int64 { return s.Errcode999 }},
			{mockplatform.Faults{HTTP5xx: 1}, reply{Status: 500}, func(s mockplatform.Stats) int64 { return s.HTTP5xx }},
		} {
			b := setup(t, mockplatform.Config{Faults: c.faults})
			for i := range 3 {
				got := b.mustPost(t, mockplatform.PathBusiness, vehicle(fmt.Sprint(i)))
				if got.Status != c.want.Status || got.Result != c.want.Result || got.Errcode != c.want.Errcode {
					t.Errorf("%+v: %+v, want %+v", c.faults, got, c.want)
				}
			}
			if st := b.srv.Stats(); c.count(st) != 3 || st.Accepted != 0 {
				t.Errorf("%+v: stats %+v, want 3 faults, nothing accepted", c.faults, st)
			}
			// Faults are per request: once they are off, the same messages go through.
			if err := b.srv.SetFaults(mockplatform.Faults{}); err != nil {
				t.Fatal(err)
			}
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("0")); got.Result != 0.0 {
				t.Errorf("after clearing faults: %+v, want accepted", got)
			}
		}
	})

	t.Run("FaultRatesMix", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{Seed: 42, Faults: mockplatform.Faults{Errcode998: 0.1, Errcode999: 0.2, HTTP5xx: 0.1}})
		const n = 500
		for i := range n {
			b.mustPost(t, mockplatform.PathHeartbeat, heartbeat(fmt.Sprint(i)))
		}
		st := b.srv.Stats()
		if st.Errcode998+st.Errcode999+st.HTTP5xx+st.Accepted != n {
			t.Fatalf("stats %+v do not add up to %d", st, n)
		}
		// Generous bounds: the seed fixes the outcome, these only catch a
		// rate wired to the wrong fault.
		for _, c := range []struct {
			name   string
			got    int64
			lo, hi int64
		}{{"998", st.Errcode998, 25, 75}, {"999", st.Errcode999, 70, 130}, {"5xx", st.HTTP5xx, 25, 75}, {"accepted", st.Accepted, 250, 350}} {
			if c.got < c.lo || c.got > c.hi {
				t.Errorf("%s: %d of %d, want %d..%d", c.name, c.got, n, c.lo, c.hi)
			}
		}
	})

	t.Run("NumericErrcode", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{NumericErrcode: true})
		b.mustPost(t, mockplatform.PathBusiness, vehicle("v1"))
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Errcode != 4.0 {
			t.Errorf("duplicate: %s, want errcode as the number 4", got.Raw)
		}
	})

	t.Run("RejectsInvalidFaults", func(t *testing.T) {
		t.Parallel()
		p := mockplatform.New(mockplatform.Config{})
		for _, f := range []mockplatform.Faults{{Errcode998: -0.1}, {HTTP5xx: 1.5}, {Errcode998: 0.6, Errcode999: 0.6}, {Latency: -time.Second}} {
			if err := p.SetFaults(f); err == nil {
				t.Errorf("SetFaults(%+v) accepted", f)
			}
		}
		if _, err := mockplatform.Start(mockplatform.Config{Faults: mockplatform.Faults{HTTP5xx: 2}}); err == nil {
			t.Error("Start accepted a 5xx rate of 2")
		}
	})

	t.Run("Down", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.srv.SetDown(true, 1500*time.Millisecond)
		got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1"))
		if got.Status != http.StatusServiceUnavailable || got.RetryAfter != "2" {
			t.Errorf("while down: %d Retry-After %q, want 503 with Retry-After 2", got.Status, got.RetryAfter)
		}
		b.srv.SetDown(true, 0)
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Status != http.StatusServiceUnavailable || got.RetryAfter != "" {
			t.Errorf("down without Retry-After: %d %q", got.Status, got.RetryAfter)
		}
		b.srv.SetDown(false, 0)
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Result != 0.0 {
			t.Errorf("back up: %+v, want the message accepted for the first time", got)
		}
		if st := b.srv.Stats(); st.Unavailable != 2 || st.Accepted != 1 || st.Duplicates != 0 {
			t.Errorf("stats %+v", st)
		}
	})

	t.Run("HangHoldsRequestsUntilRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.srv.Hang()
		const n = 4
		var wg sync.WaitGroup
		replies := make([]reply, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i], errs[i] = b.post(context.Background(), t, mockplatform.PathBusiness, vehicle(fmt.Sprint(i)))
			}()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.srv.WaitFor(ctx, func(s mockplatform.Stats) bool { return s.Hung == n }); err != nil {
			t.Fatal(err)
		}
		if st := b.srv.Stats(); st.InFlight != n || st.PeakInFlight != n || st.Accepted != 0 {
			t.Fatalf("while hanging: %+v, want %d in flight and nothing answered", st, n)
		}
		b.srv.Release()
		wg.Wait()
		for i := range n {
			if errs[i] != nil || replies[i].Result != 0.0 {
				t.Errorf("request %d after release: %+v, %v", i, replies[i], errs[i])
			}
		}
		if st := b.srv.Stats(); st.InFlight != 0 || st.PeakInFlight != n || st.Accepted != n {
			t.Errorf("after release: %+v", st)
		}
	})

	t.Run("HungClientGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.srv.Hang()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := b.post(ctx, t, mockplatform.PathHeartbeat, heartbeat("h"))
			done <- err
		}()
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		if err := b.srv.WaitFor(wctx, func(s mockplatform.Stats) bool { return s.Hung == 1 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("client error %v, want context.Canceled", err)
		}
		if err := b.srv.WaitFor(wctx, func(s mockplatform.Stats) bool { return s.InFlight == 0 }); err != nil {
			t.Fatalf("the abandoned request is still held: %v", err)
		}
		if _, ok := b.srv.Delivery("h"); ok {
			t.Error("an abandoned request was recorded as delivered")
		}
	})

	t.Run("CloseReleasesHungRequests", func(t *testing.T) {
		t.Parallel()
		srv, err := mockplatform.Start(mockplatform.Config{})
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		srv.Hang()
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := (&http.Client{Transport: tr}).Post(srv.URL+mockplatform.PathHeartbeat, "application/json", strings.NewReader("{}"))
			if err == nil {
				resp.Body.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.WaitFor(ctx, func(s mockplatform.Stats) bool { return s.Hung == 1 }); err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		<-done
	})

	t.Run("LatencyDelaysAnswers", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{Faults: mockplatform.Faults{Latency: time.Hour}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := b.post(ctx, t, mockplatform.PathHeartbeat, heartbeat("h"))
			done <- err
		}()
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		if err := b.srv.WaitFor(wctx, func(s mockplatform.Stats) bool { return s.InFlight == 1 }); err != nil {
			t.Fatal(err)
		}
		// The request is in the handler, held by the latency; it is not
		// answered while we wait on it, and gives up when the client does.
		select {
		case err := <-done:
			t.Fatalf("answered despite an hour of latency: %v", err)
		default:
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("client error %v, want context.Canceled", err)
		}
		if err := b.srv.SetFaults(mockplatform.Faults{}); err != nil {
			t.Fatal(err)
		}
		if got := b.mustPost(t, mockplatform.PathHeartbeat, heartbeat("h")); got.Result != 0.0 {
			t.Errorf("without latency: %+v", got)
		}
	})

	t.Run("ResetAndWaitFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.mustPost(t, mockplatform.PathBusiness, vehicle("v1"))
		b.srv.Reset()
		if st := b.srv.Stats(); st.Requests != 0 || st.Accepted != 0 {
			t.Errorf("after reset: %+v", st)
		}
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Result != 0.0 {
			t.Errorf("after reset the message is new again: %+v", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := b.srv.WaitFor(ctx, func(s mockplatform.Stats) bool { return s.Accepted > 5 }); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitFor on an unmet condition: %v, want DeadlineExceeded", err)
		}
	})
}

// TestFaultsRefusedInTheirNames: a share outside [0, 1] (NaN too), shares
// of answers that add up to more than every answer, or a negative latency
// is refused, in the fields' names or the caller's.
func TestFaultsRefusedInTheirNames(t *testing.T) {
	p := mockplatform.New(mockplatform.Config{})
	for _, c := range []struct {
		f    mockplatform.Faults
		want string
	}{
		{mockplatform.Faults{HTTP5xx: 1.5}, "mockplatform: HTTP5xx 1.5: want a share from 0 to 1"},
		{mockplatform.Faults{FirstTry999: math.NaN()}, "mockplatform: FirstTry999 NaN: want a share from 0 to 1"},
		{mockplatform.Faults{Errcode998: 0.5, Errcode999: 0.5, HTTP5xx: 0.5}, "mockplatform: Errcode998, Errcode999 and HTTP5xx add up to 1.5, more than every answer"},
		{mockplatform.Faults{LatencyJitter: -time.Second}, "mockplatform: Latency 0s, LatencyJitter -1s: a latency is not negative"},
	} {
		if err := p.SetFaults(c.f); err == nil || err.Error() != c.want {
			t.Errorf("SetFaults(%+v): %v, want %q", c.f, err, c.want)
		}
		if _, err := mockplatform.Start(mockplatform.Config{Faults: c.f}); err == nil || err.Error() != c.want {
			t.Errorf("Start with %+v: %v, want %q", c.f, err, c.want)
		}
	}
	if err := p.SetFaults(mockplatform.Faults{HTTP5xx: 1, FirstTry999: 1}); err != nil {
		t.Errorf("the largest shares: %v", err)
	}
	err := mockplatform.Faults{Errcode999: 2}.Validate(func(field string) string { return "-" + strings.ToLower(field) })
	if want := "-errcode999 2: want a share from 0 to 1"; err == nil || err.Error() != want {
		t.Errorf("in the caller's names: %v, want %q", err, want)
	}
}
