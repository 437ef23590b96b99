package outboxdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestTraceParent: the trace context a message is inserted under comes back
// with every claim of its row, direct or from the database, and a message
// inserted without one stores NULL (docs/operations.md, "Tracing").
func TestTraceParent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	t.Run("InsertStoresItAndClaimReturnsIt", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		traced, plain := pendingRec("traced", 1), pendingRec("plain", 2)
		traced.TraceParent = tp
		if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{traced, plain}); err != nil {
			t.Fatal(err)
		}
		stored := map[string]*string{}
		rows, err := pool.Query(ctx, `SELECT message_key, trace_parent FROM forward_messages`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k string
			var v *string
			if err := rows.Scan(&k, &v); err != nil {
				t.Fatal(err)
			}
			stored[k] = v
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if v := stored["traced"]; v == nil || *v != tp {
			t.Errorf("stored trace_parent %v, want %s", v, tp)
		}
		if v, ok := stored["plain"]; !ok || v != nil {
			t.Errorf("a message inserted without tracing stored trace_parent %v (present %v), want NULL", v, ok)
		}
		got, err := outboxdb.Claim(ctx, pool, 10, time.Minute, "me")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("claimed %d rows, want 2", len(got))
		}
		for _, r := range got {
			switch r.MessageKey {
			case "traced":
				if r.TraceParent == nil || *r.TraceParent != tp {
					t.Errorf("claim returned trace_parent %v, want %s", r.TraceParent, tp)
				}
			case "plain":
				if r.TraceParent != nil {
					t.Errorf("claim of an untraced row returned trace_parent %q, want none", *r.TraceParent)
				}
			}
		}
	})

	t.Run("DirectClaimCarriesIt", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewPool(t)
		traced := pendingRec("traced", 1)
		traced.TraceParent = tp
		_, claimed, err := outboxdb.InsertBatchClaim(ctx, pool, []outboxdb.NewRecord{traced, pendingRec("plain", 2)},
			outboxdb.DirectClaim{Limit: 2, Lease: time.Minute, Claimer: "me"})
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) != 2 {
			t.Fatalf("claimed %d rows, want 2", len(claimed))
		}
		for _, r := range claimed {
			if want := r.MessageKey == "traced"; (r.TraceParent != nil) != want || (want && *r.TraceParent != tp) {
				t.Errorf("%s handed over with trace_parent %v", r.MessageKey, r.TraceParent)
			}
		}
	})
}
