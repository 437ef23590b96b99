package prometheus

import (
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// TestOrderingGauges: the ordering gauges come with the record gauges, from
// the same refresh; held rows count as PENDING as well.
func TestOrderingGauges(t *testing.T) {
	t.Parallel()
	b := setupRefresher(t, "")
	db := fixture.New(t, b.pool)
	db.Insert(
		fixture.Row{Key: "blocked", Status: "FAILED", OrderingKey: "P1/B1", OrderBlocked: true, Age: 20 * time.Minute},
		fixture.Row{Key: "held-1", OrderingKey: "P1/B1", OrderHeld: true, Age: 3 * time.Minute},
		fixture.Row{Key: "head", Status: "IN_PROGRESS", OrderingKey: "P1/B2"},
		fixture.Row{Key: "held-2", OrderingKey: "P1/B2", OrderHeld: true},
	)
	if _, err := b.o.runOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, b.o)
	value := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("%s not exported", name)
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	if v := value(metricOrderingHeld); v != 2 {
		t.Errorf("%s = %v, want 2", metricOrderingHeld, v)
	}
	if v := value(metricOrderingBlocked); v != 1 {
		t.Errorf("%s = %v, want 1", metricOrderingBlocked, v)
	}
	if v := value(metricOrderingOldestHeld); v < 179 || v > 3600 {
		t.Errorf("%s = %v, want the 180 s held-1 has waited", metricOrderingOldestHeld, v)
	}
	if v := value(metricOrderingBlockedAge); v < 1199 || v > 3600 {
		t.Errorf("%s = %v, want the 1200 s the key has been blocked", metricOrderingBlockedAge, v)
	}
	if v := value(metricRecordsPending); v != 2 {
		t.Errorf("%s = %v, want the 2 held rows", metricRecordsPending, v)
	}
}
