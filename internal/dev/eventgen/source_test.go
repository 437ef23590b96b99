package eventgen_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
)

func newSource(t *testing.T, cfg eventgen.SourceConfig) *eventgen.Source {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 7
	}
	if cfg.Now == nil {
		at := time.Date(2026, 5, 21, 2, 30, 0, 0, time.UTC)
		cfg.Now = func() time.Time { return at }
	}
	s, err := eventgen.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// decode reads a message the way the mapping does, keeping numbers as written.
func decode(t *testing.T, v []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decoding %s: %v", v, err)
	}
	return m
}

func TestSource(t *testing.T) {
	t.Parallel()

	t.Run("GoodMessagesFollowTheContract", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{})
		ids := map[string]bool{}
		kinds := map[eventgen.Kind]int{}
		const n = 5000
		for range n {
			m := s.Next()
			if m.Flaw != eventgen.FlawNone || !m.Deliverable() || m.Malformed() {
				t.Fatalf("flaw %q with no flaw rates set", m.Flaw)
			}
			kinds[m.Kind]++
			if ids[m.MessageID] {
				t.Fatalf("messageId %s repeated", m.MessageID)
			}
			ids[m.MessageID] = true
			ev := decode(t, m.Value)
			if ev["messageId"] != m.MessageID || ev["deviceId"] != string(m.Key) {
				t.Fatalf("message %s: messageId/key do not match the value", m.Value)
			}
			checkGood(t, m, ev)
		}
		// Four vehicle events to one heartbeat, give or take chance.
		if v, h := kinds[eventgen.Vehicle], kinds[eventgen.Heartbeat]; v < 3*h || v > 5*h {
			t.Errorf("%d vehicle events and %d heartbeats, want about 4:1", v, h)
		}
	})

	t.Run("FieldOrderMatchesTheContract", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{StringNumberRate: -1})
		var vehicle, heartbeat string
		for vehicle == "" || heartbeat == "" {
			m := s.Next()
			if m.Kind == eventgen.Vehicle {
				vehicle = string(m.Value)
			} else {
				heartbeat = string(m.Value)
			}
		}
		for _, c := range []struct{ got, order string }{
			{vehicle, `{"messageId":"|","deviceId":"CAM-|","parkCode":"P|","berthCode":"B-|","itemId":|,"plateNo":"|,"inoutType":|,"inoutTime":1779330|,"pictures":[`},
			{heartbeat, `{"messageId":"|","deviceId":"CAM-|","parkCode":"P|","berthCode":"B-|","captureTime":1779330600000,"picType":|,"picUrl":"|"}`},
		} {
			rest := c.got
			for _, part := range strings.Split(c.order, "|") {
				i := strings.Index(rest, part)
				if i < 0 {
					t.Errorf("%s: %q missing or out of order", c.got, part)
					break
				}
				rest = rest[i+len(part):]
			}
		}
	})

	t.Run("SameSeedSameMessages", func(t *testing.T) {
		t.Parallel()
		cfg := eventgen.SourceConfig{Seed: 99, DuplicateRate: 0.1, MalformedRate: 0.1}
		a, b := newSource(t, cfg), newSource(t, cfg)
		for range 200 {
			if ma, mb := a.Next(), b.Next(); !bytes.Equal(ma.Value, mb.Value) || ma.Flaw != mb.Flaw {
				t.Fatalf("same seed diverged: %s vs %s", ma.Value, mb.Value)
			}
		}
	})

	t.Run("DuplicatesRepeatEarlierGoodMessages", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{DuplicateRate: 0.3})
		good := map[string][]byte{}
		dups := 0
		for range 2000 {
			m := s.Next()
			switch m.Flaw {
			case eventgen.FlawNone:
				good[m.MessageID] = m.Value
			case eventgen.FlawDuplicate:
				dups++
				if orig, ok := good[m.MessageID]; !ok || !bytes.Equal(orig, m.Value) {
					t.Fatalf("duplicate %s does not repeat an earlier good message byte for byte", m.Value)
				}
				if m.Deliverable() || m.Malformed() {
					t.Fatal("a duplicate counts as deliverable or malformed")
				}
			default:
				t.Fatalf("unexpected flaw %q", m.Flaw)
			}
		}
		if dups < 450 || dups > 750 {
			t.Errorf("%d duplicates of 2000 at rate 0.3", dups)
		}
	})

	t.Run("MalformedMessagesAreBad", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{MalformedRate: 1})
		seen := map[eventgen.Flaw]int{}
		for range 3000 {
			m := s.Next()
			if !m.Malformed() || m.Deliverable() {
				t.Fatalf("flaw %q is not malformed", m.Flaw)
			}
			seen[m.Flaw]++
			checkBad(t, m)
		}
		for _, f := range eventgen.MalformedFlaws {
			if seen[f] == 0 {
				t.Errorf("flaw %q never produced", f)
			}
		}
	})

	t.Run("MissingMessageID", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{MissingIDRate: 1})
		m := s.Next()
		if m.Flaw != eventgen.FlawMissingID || m.MessageID != "" || !m.Deliverable() {
			t.Fatalf("message %+v", m)
		}
		if _, ok := decode(t, m.Value)["messageId"]; ok {
			t.Errorf("value %s still has a messageId", m.Value)
		}
	})

	// The plate the README and docs/operations.md look up is in the
	// traffic, often enough to be found within a minute of `make run`.
	t.Run("ExamplePlate", func(t *testing.T) {
		t.Parallel()
		s := newSource(t, eventgen.SourceConfig{})
		found := 0
		for range 2000 {
			m := s.Next()
			if m.Kind == eventgen.Vehicle && decode(t, m.Value)["plateNo"] == eventgen.ExamplePlate {
				found++
			}
		}
		if found < 3 {
			t.Errorf("%s in %d of 2000 messages, want it every few hundred", eventgen.ExamplePlate, found)
		}
	})

	t.Run("RejectsBadRates", func(t *testing.T) {
		t.Parallel()
		for _, cfg := range []eventgen.SourceConfig{{DuplicateRate: -0.1}, {MalformedRate: 1.1}, {DuplicateRate: 0.6, MalformedRate: 0.6}} {
			if _, err := eventgen.NewSource(cfg); err == nil {
				t.Errorf("NewSource(%+v) accepted", cfg)
			}
		}
	})
}

var vehicleRequired = []string{"deviceId", "parkCode", "berthCode", "plateNo", "inoutType", "inoutTime"}
var heartbeatRequired = []string{"deviceId", "parkCode", "berthCode", "captureTime", "picType", "picUrl"}

func checkGood(t *testing.T, m eventgen.Message, ev map[string]any) {
	t.Helper()
	required := vehicleRequired
	if m.Kind == eventgen.Heartbeat {
		required = heartbeatRequired
	}
	for _, f := range required {
		if _, ok := ev[f]; !ok {
			t.Fatalf("%s lacks %s", m.Value, f)
		}
	}
	picOK := func(pt any, url any) {
		if s, _ := url.(string); s == "" {
			t.Fatalf("%s: empty picUrl", m.Value)
		}
		switch pt {
		case json.Number("1"), json.Number("2"), json.Number("3"), json.Number("4"):
		default:
			t.Fatalf("%s: picType %v", m.Value, pt)
		}
	}
	if m.Kind == eventgen.Heartbeat {
		if m.Topic != eventgen.DefaultHeartbeatTopic {
			t.Fatalf("heartbeat on %s", m.Topic)
		}
		picOK(ev["picType"], ev["picUrl"])
		return
	}
	if m.Topic != eventgen.DefaultVehicleTopic {
		t.Fatalf("vehicle event on %s", m.Topic)
	}
	if it := ev["inoutType"]; it != json.Number("0") && it != json.Number("1") {
		t.Fatalf("%s: inoutType %v", m.Value, it)
	}
	if p, _ := ev["plateNo"].(string); utf8.RuneCountInString(p) < 7 {
		t.Fatalf("%s: plate %q", m.Value, p)
	}
	pics, ok := ev["pictures"].([]any)
	if !ok {
		t.Fatalf("%s: pictures is not an array", m.Value)
	}
	for _, p := range pics {
		pic := p.(map[string]any)
		picOK(pic["picType"], pic["picUrl"])
	}
}

func checkBad(t *testing.T, m eventgen.Message) {
	t.Helper()
	switch m.Flaw {
	case eventgen.FlawNotJSON:
		if json.Valid(m.Value) {
			t.Fatalf("not-json value is valid JSON: %s", m.Value)
		}
	case eventgen.FlawBinary:
		if utf8.Valid(m.Value) {
			t.Fatalf("binary value is valid UTF-8")
		}
	case eventgen.FlawEmpty:
		if m.Value == nil || len(m.Value) != 0 {
			t.Fatalf("empty value %v", m.Value)
		}
	case eventgen.FlawTombstone:
		if m.Value != nil {
			t.Fatalf("tombstone value %v", m.Value)
		}
	case eventgen.FlawArray:
		var a []any
		if err := json.Unmarshal(m.Value, &a); err != nil || len(a) != 1 {
			t.Fatalf("array value %s", m.Value)
		}
	case eventgen.FlawBadInoutType:
		if ev := decode(t, m.Value); ev["inoutType"] != json.Number("7") {
			t.Fatalf("%s", m.Value)
		}
	case eventgen.FlawBadCredibility:
		if ev := decode(t, m.Value); ev["plateCredible"] != "high" {
			t.Fatalf("%s", m.Value)
		}
	case eventgen.FlawBadPicType:
		if !bytes.Contains(m.Value, []byte(`"picType":9`)) {
			t.Fatalf("%s", m.Value)
		}
	case eventgen.FlawEmptyPicURL:
		if !bytes.Contains(m.Value, []byte(`"picUrl":""`)) {
			t.Fatalf("%s", m.Value)
		}
	case eventgen.FlawMissingField:
		ev := decode(t, m.Value)
		required := vehicleRequired
		if m.Kind == eventgen.Heartbeat {
			required = heartbeatRequired
		}
		missing := 0
		for _, f := range required {
			if _, ok := ev[f]; !ok {
				missing++
			}
		}
		if missing != 1 {
			t.Fatalf("%s misses %d required fields, want 1", m.Value, missing)
		}
	default:
		t.Fatalf("unknown flaw %q", m.Flaw)
	}
}

// TestSourceBerthPairs: with Berths set, each round of 2×Berths vehicle
// events is one enter then one exit, same plate, of every berth; a berth
// always belongs to the same camera (the Kafka key), so its events share a
// partition.
func TestSourceBerthPairs(t *testing.T) {
	t.Parallel()
	const berths = 200
	src, err := eventgen.NewSource(eventgen.SourceConfig{Berths: berths, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	type state struct {
		events []eventgen.Message
		device string
	}
	seen := map[string]*state{}
	vehicles := 0
	for vehicles < 2*berths {
		m := src.Next()
		if m.Kind != eventgen.Vehicle {
			continue
		}
		vehicles++
		var ev map[string]any
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			t.Fatal(err)
		}
		if want := ev["parkCode"].(string) + "/" + ev["berthCode"].(string); m.Berth != want {
			t.Fatalf("message berth %q, payload says %q", m.Berth, want)
		}
		st := seen[m.Berth]
		if st == nil {
			st = &state{device: string(m.Key)}
			seen[m.Berth] = st
		}
		if string(m.Key) != st.device {
			t.Errorf("berth %s moved from camera %s to %s", m.Berth, st.device, m.Key)
		}
		if inout, _ := ev["inoutType"].(float64); m.Enter != (len(st.events)%2 == 0) || m.Enter != (inout == 1) {
			t.Errorf("berth %s event %d: enter %v, inoutType %v", m.Berth, len(st.events), m.Enter, ev["inoutType"])
		}
		if len(st.events)%2 == 1 {
			var enter map[string]any
			_ = json.Unmarshal(st.events[len(st.events)-1].Value, &enter)
			if enter["plateNo"] != ev["plateNo"] {
				t.Errorf("berth %s: exit plate %v, enter plate %v", m.Berth, ev["plateNo"], enter["plateNo"])
			}
		}
		st.events = append(st.events, m)
	}
	if len(seen) != berths {
		t.Fatalf("%d berths in a round, want %d", len(seen), berths)
	}
	for b, st := range seen {
		if len(st.events) != 2 {
			t.Errorf("berth %s has %d events in a round, want an enter and an exit", b, len(st.events))
		}
	}
}

// TestSourceRefusesImpossibleShares: a share outside [0, 1] (NaN too), or
// duplicates and malformed messages that add up to more than every
// message, is refused in the config's names, or the caller's.
func TestSourceRefusesImpossibleShares(t *testing.T) {
	for _, c := range []struct {
		cfg  eventgen.SourceConfig
		want string
	}{
		{eventgen.SourceConfig{DuplicateRate: 2}, "eventgen: DuplicateRate 2: want a share from 0 to 1"},
		{eventgen.SourceConfig{MalformedRate: -0.1}, "eventgen: MalformedRate -0.1: want a share from 0 to 1"},
		{eventgen.SourceConfig{MissingIDRate: math.NaN()}, "eventgen: MissingIDRate NaN: want a share from 0 to 1"},
		{eventgen.SourceConfig{DuplicateRate: 0.5, MalformedRate: 0.75}, "eventgen: DuplicateRate and MalformedRate add up to 1.25, more than every message"},
	} {
		if _, err := eventgen.NewSource(c.cfg); err == nil || err.Error() != c.want {
			t.Errorf("eventgen.NewSource(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := eventgen.NewSource(eventgen.SourceConfig{DuplicateRate: 1, MissingIDRate: 1}); err != nil {
		t.Errorf("the largest shares: %v", err)
	}
	err := eventgen.SourceConfig{MalformedRate: 1.5}.Validate(func(field string) string { return "--" + strings.ToLower(field) })
	if want := "--malformedrate 1.5: want a share from 0 to 1"; err == nil || err.Error() != want {
		t.Errorf("in the caller's names: %v, want %q", err, want)
	}
}
