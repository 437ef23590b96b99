package httpforwarder

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestOrderOnFailed: a berth's event rejected for good (errcode 998)
// releases the next event of the berth, or blocks the berth, as the
// stream's dispatcher says (order_on_failed); an output without a
// dispatcher releases it.
func TestOrderOnFailed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		dispatcher bool
		policy     outboxdb.OrderOnFailed
		wantHeld   bool
	}{
		{"SkipReleasesTheNextEvent", true, outboxdb.OrderSkip, false},
		{"BlockHoldsTheBerth", true, outboxdb.OrderBlock, true},
		{"WithoutADispatcherSkip", false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := pgtest.NewDB(t)
			pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			res := service.MockResources(service.MockResourcesOptUseLogger(
				service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(io.Discard, nil)))))
			if tc.dispatcher {
				hub, err := dispatch.HubFor(res, dsn)
				if err != nil {
					t.Fatal(err)
				}
				d, err := dispatch.NewDispatcher(hub, dispatch.DispatcherConfig{OrderOnFailed: tc.policy}, res.Logger(), dispatch.DispatcherMetrics{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = d.Close(ctx) })
			}
			p := newPlatform(t, reply(200, `{"result":1,"errcode":"998","message":"do not resend"}`))
			conf, err := httpForwarderSpec().ParseYAML(baseYAML(dsn, p.srv.URL, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := newHTTPForwarderFromParsed(conf, res)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = out.Close(ctx) })
			if err := out.Connect(ctx); err != nil {
				t.Fatal(err)
			}

			enter, exit := pendingBerthEvent("enter", 1), pendingBerthEvent("exit", 2)
			if _, err := outboxdb.InsertBatchCount(ctx, pool, []outboxdb.NewRecord{enter, exit}); err != nil {
				t.Fatal(err)
			}
			claimed, err := outboxdb.Claim(ctx, pool, 10, time.Minute, "test")
			if err != nil || len(claimed) != 1 || claimed[0].MessageKey != "enter" {
				t.Fatalf("claimed %+v (%v), want enter alone", claimed, err)
			}
			if err := out.WriteBatch(ctx, service.MessageBatch{message(claimed[0], mappedBody(claimed[0]))}); err != nil {
				t.Fatal(err)
			}
			var status string
			var blocked, held bool
			if err := pool.QueryRow(ctx, `SELECT e.status, e.order_blocked, x.order_held
				FROM forward_records e, forward_records x WHERE e.message_key = 'enter' AND x.message_key = 'exit'`).
				Scan(&status, &blocked, &held); err != nil {
				t.Fatal(err)
			}
			if status != "FAILED" || blocked != tc.wantHeld || held != tc.wantHeld {
				t.Errorf("enter %s, blocking %v; exit held %v; want FAILED, %v, %v", status, blocked, held, tc.wantHeld, tc.wantHeld)
			}
		})
	}
}

func pendingBerthEvent(key string, offset int64) outboxdb.NewRecord {
	return outboxdb.NewRecord{MessageKey: key, APIType: outboxdb.APITypeVehicleEvent, KafkaTopic: "device-vehicle-event",
		KafkaOffset: offset, Payload: []byte(`{}`), Status: outboxdb.StatusPending, OrderingKey: "P1001/B-012"}
}
