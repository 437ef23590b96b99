package mockplatform_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

func TestOrderingFeatures(t *testing.T) {
	t.Parallel()

	t.Run("FirstTry999FailsOnlyFirstRequests", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{Faults: mockplatform.Faults{FirstTry999: 1}, Seed: 7})
		for i := range 3 {
			id := fmt.Sprintf("v%d", i)
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle(id)); got.Errcode != "999" {
				t.Errorf("first request of %s: %+v, want errcode 999", id, got)
			}
			if got := b.mustPost(t, mockplatform.PathBusiness, vehicle(id)); got.Result != 0.0 {
				t.Errorf("second request of %s: %+v, want accepted", id, got)
			}
		}
		if st := b.srv.Stats(); st.Errcode999 != 3 || st.Accepted != 3 {
			t.Errorf("stats %+v", st)
		}
	})

	t.Run("FirstTry999AtARate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{Faults: mockplatform.Faults{FirstTry999: 0.2}, Seed: 11})
		const n = 500
		for i := range n {
			b.mustPost(t, mockplatform.PathBusiness, vehicle(fmt.Sprintf("v%d", i)))
		}
		// 100 expected; 4 standard deviations either way.
		if st := b.srv.Stats(); st.Errcode999 < 64 || st.Errcode999 > 136 {
			t.Errorf("%d of %d first tries failed, want about 20 %%", st.Errcode999, n)
		}
	})

	t.Run("RejectAndAccept", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{})
		b.srv.Reject("v1")
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Errcode != "998" {
			t.Errorf("rejected id: %+v, want errcode 998", got)
		}
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v2")); got.Result != 0.0 {
			t.Errorf("other id: %+v, want accepted", got)
		}
		b.srv.Accept("v1")
		if got := b.mustPost(t, mockplatform.PathBusiness, vehicle("v1")); got.Result != 0.0 {
			t.Errorf("accepted again: %+v", got)
		}
	})

	t.Run("BerthInFlightPeaksCountOverlaps", func(t *testing.T) {
		t.Parallel()
		// Long enough that requests sent together are all in flight at once.
		b := setup(t, mockplatform.Config{RecordBerths: true, Faults: mockplatform.Faults{Latency: 300 * time.Millisecond}})
		onBerth := func(id, berth string) map[string]any {
			m := vehicle(id)
			m["berth_code"] = berth
			return m
		}
		// B-1: three at once. B-2: three one after the other.
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() { b.mustPost(t, mockplatform.PathBusiness, onBerth(fmt.Sprintf("a%d", i), "B-1")) })
		}
		for i := range 3 {
			b.mustPost(t, mockplatform.PathBusiness, onBerth(fmt.Sprintf("b%d", i), "B-2"))
		}
		wg.Wait()
		b.mustPost(t, mockplatform.PathHeartbeat, heartbeat("beat"))
		got := b.srv.BerthInFlightPeaks()
		if len(got) != 2 || got["P1001/B-1"] != 3 || got["P1001/B-2"] != 1 {
			t.Errorf("peaks %v, want P1001/B-1 3 (sent together) and P1001/B-2 1 (one after the other), no heartbeat", got)
		}
		b.srv.Reset()
		if got := b.srv.BerthInFlightPeaks(); len(got) != 0 {
			t.Errorf("peaks after Reset %v, want none", got)
		}
	})

	t.Run("BerthLogKeepsTheOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, mockplatform.Config{RecordBerths: true})
		b.srv.Reject("enter")
		b.mustPost(t, mockplatform.PathBusiness, vehicle("enter"))
		b.srv.Accept("enter")
		b.mustPost(t, mockplatform.PathBusiness, vehicle("enter"))
		b.mustPost(t, mockplatform.PathBusiness, vehicle("exit"))
		b.mustPost(t, mockplatform.PathBusiness, vehicle("exit"))
		b.mustPost(t, mockplatform.PathHeartbeat, heartbeat("beat"))
		log := b.srv.BerthLog()
		got := log["P1001/B-012"]
		want := []struct{ id, outcome string }{
			{"enter", mockplatform.OutcomeRejected}, {"enter", mockplatform.OutcomeAccepted},
			{"exit", mockplatform.OutcomeAccepted}, {"exit", mockplatform.OutcomeDuplicate},
		}
		if len(log) != 1 || len(got) != len(want) {
			t.Fatalf("berth log %+v", log)
		}
		for i, w := range want {
			if got[i].MessageID != w.id || got[i].Outcome != w.outcome || (i > 0 && got[i].At.Before(got[i-1].At)) {
				t.Errorf("request %d: %+v, want %s %s", i, got[i], w.id, w.outcome)
			}
		}
	})
}
