package outbox

import (
	"context"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

func TestOrderingKeys(t *testing.T) {
	t.Parallel()
	noBerth := []byte(`{"messageId": "no-berth", "deviceId": "CAM-0001", "parkCode": "P1001", "plateNo": "粤B12345",
 "inoutType": 1, "inoutTime": 1779330600000}`)
	keys := func(t *testing.T, b *testBundle) map[string]string {
		t.Helper()
		rows, err := b.pool.Query(context.Background(), `SELECT message_key, coalesce(ordering_key, '') FROM forward_records`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var k, o string
			if err := rows.Scan(&k, &o); err != nil {
				t.Fatal(err)
			}
			out[k] = o
		}
		return out
	}
	batch := func() []*service.Message {
		return []*service.Message{
			kmsg(topicVehicle, 0, 1, vehicle("enter")),
			kmsg(topicVehicle, 0, 2, vehicle("exit")),
			kmsg(topicHeartbeat, 0, 3, heartbeat("beat")),
			kmsg(topicVehicle, 0, 4, noBerth),
			kmsg(topicVehicle, 0, 5, []byte(`{"messageId": "broken", "parkCode": "P1001", "berthCode": "B-012"`)),
		}
	}

	t.Run("BerthOrdersVehicleEventsOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML)
		process(t, p, batch()...)
		got := keys(t, b)
		want := map[string]string{"enter": "P1001/B-012", "exit": "P1001/B-012", "beat": "", "no-berth": ""}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: ordering key %q, want %q", k, got[k], w)
			}
		}
		if len(got) != 5 {
			t.Fatalf("%d rows, want 5: %v", len(got), got)
		}
		for k, o := range got {
			if _, known := want[k]; !known && o != "" {
				t.Errorf("the FAILED row %s has ordering key %q, want none", k, o)
			}
		}
		var held bool
		if err := b.pool.QueryRow(context.Background(), `SELECT order_held FROM forward_records WHERE message_key = 'exit'`).Scan(&held); err != nil || !held {
			t.Errorf("exit is not held behind enter (%v)", err)
		}
	})

	t.Run("OffOrdersNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.processor(t, defaultYAML+"ordering: off\n")
		process(t, p, batch()...)
		for k, o := range keys(t, b) {
			if o != "" {
				t.Errorf("%s: ordering key %q with ordering off", k, o)
			}
		}
	})

	t.Run("AnUnknownValueNamesTheVariable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := newProcessorIn(b.res, b.dsn, defaultYAML+"ordering: plate\n"); err == nil {
			t.Fatal("ordering: plate was accepted")
		}
	})
}
