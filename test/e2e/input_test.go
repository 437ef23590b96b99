package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
)

// vehicleJSON is a valid vehicle event (mappings/README.md) with edit applied.
func vehicleJSON(id string, edit func(m map[string]any)) []byte {
	m := map[string]any{
		"messageId": id, "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012",
		"itemId": 73421, "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1,
		"inoutTime": 1779330600000, "plateCredible": json.Number("0.854"),
		"pictures": []any{
			map[string]any{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"},
			map[string]any{"picType": 3, "picUrl": "/jieshun/2026/05/21/P1001/b.jpg"},
		},
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// heartbeatJSON is a valid heartbeat (mappings/README.md) with edit applied.
func heartbeatJSON(id string, edit func(m map[string]any)) []byte {
	m := map[string]any{
		"messageId": id, "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012",
		"captureTime": 1779330900000, "picType": 3, "picUrl": "jieshun/2026/05/21/P1001/hb.jpg",
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// TestMalformedInput sends one message of each kind the forwarder cannot
// forward (docs/guarantees.md #10): not JSON, empty, a tombstone, a JSON array or
// string, invalid UTF-8, 2 MiB of broken JSON, and each mapping error. Each
// must become a FAILED row whose last_error names the problem, and never be
// sent; the good messages behind them in the same partitions (a 2 MiB one
// among them) are delivered.
func TestMalformedInput(t *testing.T) {
	scenario(t, light, 4*time.Second)
	s := newStack(t, stackOptions{})
	id := func(name string) string { return fmt.Sprintf("e2e-%s-%d", name, s.seed%100000) }
	const key = "CAM-0001" // one partition per topic: the good messages queue behind the bad ones

	huge := append([]byte(`{"messageId":"`+id("huge-broken")+`","pad":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	cases := []struct {
		name   string
		topic  string
		value  []byte
		reason string // a substring of last_error
	}{
		{"not JSON", topicVehicle, []byte(`{"messageId":"` + id("truncated") + `","deviceId":"CAM-0001","parkCode"`), "not valid JSON"},
		{"empty", topicVehicle, []byte{}, "empty"},
		{"tombstone", topicHeartbeat, nil, "empty"},
		{"JSON array", topicVehicle, []byte("[" + string(vehicleJSON(id("array"), nil)) + "]"), "array"},
		{"JSON string", topicHeartbeat, []byte(`"hello"`), "string"},
		{"invalid UTF-8", topicVehicle, append([]byte(`{"messageId":"`+id("utf8")+`","plateNo":"`), 0xff, 0xfe, '"', '}'), "UTF-8"},
		{"2 MiB of broken JSON", topicVehicle, huge, "not valid JSON"},
		{"bad inoutType", topicVehicle, vehicleJSON(id("inout7"), func(m map[string]any) { m["inoutType"] = 7 }), "mapping: inoutType 7 is not 0 or 1"},
		{"missing inoutType", topicVehicle, vehicleJSON(id("noinout"), func(m map[string]any) { delete(m, "inoutType") }), "inoutType is missing"},
		{"missing plateNo", topicVehicle, vehicleJSON(id("noplate"), func(m map[string]any) { delete(m, "plateNo") }), "plateNo is missing"},
		{"missing inoutTime", topicVehicle, vehicleJSON(id("notime"), func(m map[string]any) { delete(m, "inoutTime") }), "inoutTime is missing"},
		{"bad picType", topicVehicle, vehicleJSON(id("pic9"), func(m map[string]any) {
			m["pictures"] = []any{map[string]any{"picType": 9, "picUrl": "a.jpg"}}
		}), "picType 9"},
		{"non-numeric plateCredible", topicVehicle, vehicleJSON(id("cred"), func(m map[string]any) { m["plateCredible"] = "high" }), `plateCredible "high"`},
		{"empty picUrl", topicVehicle, vehicleJSON(id("nourl"), func(m map[string]any) {
			m["pictures"] = []any{map[string]any{"picType": 1, "picUrl": ""}}
		}), "picUrl is empty"},
		{"non-integer itemId", topicVehicle, vehicleJSON(id("item"), func(m map[string]any) { m["itemId"] = json.Number("1.5") }), "itemId 1.5"},
		{"heartbeat missing captureTime", topicHeartbeat, heartbeatJSON(id("hbtime"), func(m map[string]any) { delete(m, "captureTime") }), "captureTime is missing"},
		{"heartbeat bad picType", topicHeartbeat, heartbeatJSON(id("hbpic"), func(m map[string]any) { m["picType"] = 9 }), "picType 9"},
		{"heartbeat empty picUrl", topicHeartbeat, heartbeatJSON(id("hburl"), func(m map[string]any) { m["picUrl"] = "" }), "picUrl is empty"},
	}
	for _, c := range cases {
		rec := &kgo.Record{Topic: c.topic, Key: []byte(key), Value: c.value}
		s.produceRecords(rec)
		var msgID string
		if i := bytes.Index(c.value, []byte(`"messageId":"`)); i >= 0 {
			rest := c.value[i+len(`"messageId":"`):]
			msgID = string(rest[:bytes.IndexByte(rest, '"')])
		}
		s.exp.addBad(badMsg{at: coord{rec.Topic, rec.Partition, rec.Offset}, messageID: msgID, flaw: eventgen.Flaw(c.name), reason: c.reason})
	}

	// Good messages behind them: a 2 MiB vehicle event (its padding is an
	// unknown field, which the mapping ignores), a plain one and a heartbeat.
	goods := []*kgo.Record{
		{Topic: topicVehicle, Key: []byte(key), Value: vehicleJSON(id("good-huge"), func(m map[string]any) { m["padding"] = strings.Repeat("y", 2<<20) })},
		{Topic: topicVehicle, Key: []byte(key), Value: vehicleJSON(id("good-vehicle"), nil)},
		{Topic: topicHeartbeat, Key: []byte(key), Value: heartbeatJSON(id("good-heartbeat"), nil)},
	}
	s.produceRecords(goods...)
	for _, name := range []string{"good-huge", "good-vehicle", "good-heartbeat"} {
		s.exp.addGood(id(name))
	}

	start := time.Now()
	p := s.start("forwarder", nil)
	s.waitSettled(2 * time.Minute)
	r := s.verify()
	if p.Exited() {
		t.Errorf("the forwarder stopped after the malformed messages")
	}

	rows, err := s.readRows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rows {
		if x.status == "FAILED" {
			t.Logf("FAILED %-45s %s", x.at.key(), x.lastError)
		}
	}
	t.Logf("%d malformed messages FAILED with their reasons and %d good ones delivered in %s: %s",
		len(cases), len(goods), time.Since(start).Round(time.Millisecond), r)
}

// TestTopicCreatedAgainWithoutMessageIDs: messages without a messageId are
// keyed by their Kafka coordinates. The vehicle topic is deleted and created
// again under a running forwarder, and its offsets start over: the new
// topic's messages, at the old ones' coordinates with other payloads, are
// each delivered once (under their coordinates, '~' and a hash), as the old
// topic's were, instead of being skipped as other messages reusing a key.
func TestTopicCreatedAgainWithoutMessageIDs(t *testing.T) {
	scenario(t, light, 15*time.Second)
	s := newStack(t, stackOptions{})
	const n = 4
	withoutID := func(plate string) *kgo.Record {
		return &kgo.Record{Topic: topicVehicle, Key: []byte("CAM-0001"), Value: vehicleJSON("", func(m map[string]any) {
			delete(m, "messageId")
			m["plateNo"] = plate
		})}
	}
	delivered := func(want int) []mockplatform.Delivery {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= int64(want) }); err != nil {
			t.Fatalf("the platform accepted %d messages, want %d: %v", s.platform.Stats().Accepted, want, err)
		}
		return s.platform.Deliveries()
	}

	old := make([]*kgo.Record, n)
	for i := range old {
		old[i] = withoutID(fmt.Sprintf("粤B0000%d", i))
	}
	s.produceRecords(old...)
	s.start("forwarder", nil)
	delivered(n)

	ctx := t.Context()
	if _, err := s.kafka.Admin(t).DeleteTopic(ctx, topicVehicle); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kafka.Admin(t).CreateTopic(ctx, partitions, 1, nil, topicVehicle); err != nil {
		t.Fatal(err)
	}
	// A client that never saw the old topic (the stack's producer keeps its ID).
	producer := s.kafka.Client(t)
	again := make([]*kgo.Record, n)
	for i := range again {
		again[i] = withoutID(fmt.Sprintf("粤B1111%d", i))
	}
	if err := producer.ProduceSync(ctx, again...).FirstErr(); err != nil {
		t.Fatalf("producing to the new topic: %v", err)
	}
	for i := range again {
		if a, o := again[i], old[i]; a.Partition != o.Partition || a.Offset != o.Offset {
			t.Fatalf("the new topic's record %d is at %d@%d, the old one's at %d@%d: want the same coordinates", i, a.Partition, a.Offset, o.Partition, o.Offset)
		}
	}

	delivered(2 * n)
	time.Sleep(2 * time.Second) // anything more would show now
	got := s.platform.Deliveries()
	if len(got) != 2*n {
		t.Fatalf("the platform has %d messages, want %d: %+v", len(got), 2*n, got)
	}
	plain, apart := 0, 0
	for _, d := range got {
		if d.Count != 1 {
			t.Errorf("%s accepted %d times, want once", d.MessageID, d.Count)
		}
		if _, hash, ok := strings.Cut(d.MessageID, "~"); ok && len(hash) == 16 {
			apart++
		} else {
			plain++
		}
	}
	if plain != n || apart != n {
		t.Errorf("%d messages under their coordinates and %d under coordinates~hash, want %d and %d: %+v", plain, apart, n, n, got)
	}
	var rows int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM forward_messages").Scan(&rows); err != nil || rows != 2*n {
		t.Errorf("%d rows (%v), want %d", rows, err, 2*n)
	}
}
