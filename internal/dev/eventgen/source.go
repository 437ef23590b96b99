// Package eventgen makes realistic parking-camera traffic: vehicle in/out
// events and heartbeats in the documented formats (mappings/README.md), with unique
// messageIds, plus a configurable share of duplicates (earlier messages sent
// again byte for byte, as Kafka producers retrying do) and of malformed
// messages (not JSON, a JSON array, a bad inoutType, a missing required
// field, ...).
//
// Source makes the messages; Generator produces them to Kafka with franz-go
// at a given rate. The dev stack, the end-to-end tests and the benchmarks
// use both.
package eventgen

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/forwarder/forwarder/internal/dev/shares"
)

// Default topics (docs/configuration.md).
const (
	DefaultVehicleTopic   = "device-vehicle-event"
	DefaultHeartbeatTopic = "device-heartbeat"
)

// Kind is the kind of camera message.
type Kind int

// Kinds of message. Vehicle events outnumber heartbeats 4 to 1.
const (
	Vehicle Kind = iota
	Heartbeat
)

func (k Kind) String() string {
	if k == Heartbeat {
		return "heartbeat"
	}
	return "vehicle"
}

// Flaw says what is wrong with a message, if anything.
type Flaw string

// Flaws. A message with FlawNone is delivered; a FlawDuplicate message is a
// byte-for-byte copy of an earlier FlawNone message (same messageId), so it
// adds no row and no delivery; every other flaw makes the message a bad one
// that the forwarder persists FAILED and never sends.
const (
	FlawNone      Flaw = ""
	FlawDuplicate Flaw = "duplicate"

	FlawNotJSON        Flaw = "not-json"          // a truncated JSON object
	FlawBinary         Flaw = "binary"            // bytes that are not UTF-8
	FlawArray          Flaw = "json-array"        // a valid message wrapped in [ ]
	FlawEmpty          Flaw = "empty"             // a zero-length value
	FlawTombstone      Flaw = "tombstone"         // a null value
	FlawBadInoutType   Flaw = "bad-inout-type"    // vehicle inoutType 7
	FlawMissingField   Flaw = "missing-field"     // a required field removed
	FlawBadPicType     Flaw = "bad-pic-type"      // picType 9
	FlawBadCredibility Flaw = "bad-credibility"   // plateCredible "high"
	FlawEmptyPicURL    Flaw = "empty-pic-url"     // picUrl ""
	FlawMissingID      Flaw = "missing-messageId" // not a bad message: keyed by topic-partition-offset
)

// MalformedFlaws are the flaws Source picks from for malformed messages.
var MalformedFlaws = []Flaw{
	FlawNotJSON, FlawBinary, FlawArray, FlawEmpty, FlawTombstone, FlawBadInoutType,
	FlawMissingField, FlawBadPicType, FlawBadCredibility, FlawEmptyPicURL,
}

// Message is one Kafka record to produce.
type Message struct {
	Kind  Kind
	Topic string
	// Key is the camera's deviceId, so a camera's messages stay in order.
	Key []byte
	// Value is the record value; nil for a tombstone.
	Value []byte
	// MessageID is the messageId in Value, "" when it has none.
	MessageID string
	// Berth is a vehicle event's parkCode + "/" + berthCode (the
	// forwarder's ordering key), "" for a heartbeat.
	Berth string
	// Enter says a vehicle event is an enter (inoutType 1), not an exit.
	Enter bool
	Flaw  Flaw
}

// Deliverable reports whether the platform should receive the message
// (once, whatever the duplicates).
func (m Message) Deliverable() bool { return m.Flaw == FlawNone || m.Flaw == FlawMissingID }

// Malformed reports whether the forwarder must persist the message FAILED.
func (m Message) Malformed() bool { return !m.Deliverable() && m.Flaw != FlawDuplicate }

// SourceConfig configures a Source.
type SourceConfig struct {
	// VehicleTopic and HeartbeatTopic default to the documented topics.
	VehicleTopic, HeartbeatTopic string
	// DuplicateRate is the share of messages that repeat an earlier good
	// message byte for byte.
	DuplicateRate float64
	// MalformedRate is the share of messages with one of MalformedFlaws.
	MalformedRate float64
	// MissingIDRate is the share of good messages without a messageId (they
	// are delivered under their topic-partition-offset key).
	MissingIDRate float64
	// StringNumberRate is the share of vehicle events whose numbers
	// (itemId, plateColor, plateCredible) arrive as JSON strings (default
	// 0.05; negative for none).
	StringNumberRate float64
	// Devices is the number of cameras (default 50), ten per car park.
	Devices int
	// Berths, when positive, makes vehicle events enter/exit pairs of this
	// many berths, four per camera (Devices becomes Berths/4, rounded up):
	// a berth's enter (inoutType 1) is followed, later, by its exit
	// (inoutType 0) with the same plate, and every berth has one pair per
	// round of 2×Berths vehicle events, interleaved at random with the
	// other berths'. Without it a vehicle event is an enter or an exit at
	// random, on a random berth of its camera.
	Berths int
	// Seed makes the sequence reproducible; 0 picks a random seed. Runs that
	// share a database need different seeds, or their messageIds repeat.
	Seed uint64
	// Now gives event times (default time.Now).
	Now func() time.Time
}

// Source makes camera messages. It is not safe for concurrent use.
type Source struct {
	cfg    SourceConfig
	rng    *rand.Rand
	n      int64
	plates int64     // plates drawn, for ExamplePlate
	recent []Message // recent good messages, the pool duplicates are drawn from
	next   int
	pairs  pairs
}

// pairs is the state of the berths in pair mode (SourceConfig.Berths).
type pairs struct {
	unused []int          // berths without an enter in this round
	open   []int          // berths with a car in
	plate  map[int]string // the plate of each open berth
}

// step picks the next vehicle event: an exit of a random open berth or the
// enter of a random berth not yet used in this round, evenly.
func (s *Source) step() (berth int, enter bool, plate string) {
	p := &s.pairs
	if len(p.open) > 0 && (len(p.unused) == 0 || s.rng.IntN(2) == 0) {
		i := s.rng.IntN(len(p.open))
		berth = p.open[i]
		p.open[i] = p.open[len(p.open)-1]
		p.open = p.open[:len(p.open)-1]
		plate = p.plate[berth]
		delete(p.plate, berth)
		return berth, false, plate
	}
	if len(p.unused) == 0 {
		p.unused = make([]int, s.cfg.Berths)
		for i := range p.unused {
			p.unused[i] = i
		}
	}
	i := s.rng.IntN(len(p.unused))
	berth = p.unused[i]
	p.unused[i] = p.unused[len(p.unused)-1]
	p.unused = p.unused[:len(p.unused)-1]
	plate = s.plate()
	p.open = append(p.open, berth)
	p.plate[berth] = plate
	return berth, true, plate
}

// Validate checks the shares of messages: each from 0 to 1, duplicates
// and malformed ones together at most every message. Its errors call a field
// name(field), e.g. the flag that set it; nil keeps the Go names.
func (cfg SourceConfig) Validate(name func(field string) string) error {
	return shares.Validate("message", name,
		shares.Share{Field: "DuplicateRate", Value: cfg.DuplicateRate, Exclusive: true},
		shares.Share{Field: "MalformedRate", Value: cfg.MalformedRate, Exclusive: true},
		shares.Share{Field: "MissingIDRate", Value: cfg.MissingIDRate})
}

// NewSource returns a Source.
func NewSource(cfg SourceConfig) (*Source, error) {
	if cfg.VehicleTopic == "" {
		cfg.VehicleTopic = DefaultVehicleTopic
	}
	if cfg.HeartbeatTopic == "" {
		cfg.HeartbeatTopic = DefaultHeartbeatTopic
	}
	if cfg.Devices <= 0 {
		cfg.Devices = 50
	}
	if cfg.Berths < 0 {
		return nil, fmt.Errorf("eventgen: %d berths", cfg.Berths)
	}
	if cfg.Berths > 0 {
		cfg.Devices = (cfg.Berths + 3) / 4
	}
	if cfg.StringNumberRate == 0 {
		cfg.StringNumberRate = 0.05
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := cfg.Validate(nil); err != nil {
		return nil, fmt.Errorf("eventgen: %w", err)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Source{cfg: cfg, rng: rand.New(rand.NewPCG(seed, ^seed)), pairs: pairs{plate: map[int]string{}}}, nil
}

// recentSize bounds the memory kept for duplicates.
const recentSize = 1024

// Next returns the next message.
func (s *Source) Next() Message {
	s.n++
	roll := s.rng.Float64()
	if roll < s.cfg.DuplicateRate && len(s.recent) > 0 {
		m := s.recent[s.rng.IntN(len(s.recent))]
		m.Flaw = FlawDuplicate
		return m
	}
	kind := Vehicle
	if s.rng.IntN(5) == 0 {
		kind = Heartbeat
	}
	if roll < s.cfg.DuplicateRate+s.cfg.MalformedRate {
		return s.malformed(kind, MalformedFlaws[s.rng.IntN(len(MalformedFlaws))])
	}
	ev := s.event(kind)
	flaw := FlawNone
	if s.rng.Float64() < s.cfg.MissingIDRate {
		ev.delete("messageId")
		flaw = FlawMissingID
	}
	m := s.message(kind, ev, flaw)
	if flaw == FlawNone {
		if len(s.recent) < recentSize {
			s.recent = append(s.recent, m)
		} else {
			s.recent[s.next] = m
			s.next = (s.next + 1) % recentSize
		}
	}
	return m
}

func (s *Source) message(kind Kind, ev *object, flaw Flaw) Message {
	// The key is the camera, even when the value lost its deviceId.
	m := Message{Kind: kind, Topic: s.cfg.VehicleTopic, Key: []byte(ev.device), Value: ev.marshal(), Flaw: flaw}
	if kind == Heartbeat {
		m.Topic = s.cfg.HeartbeatTopic
	}
	if id, ok := ev.get("messageId").(string); ok {
		m.MessageID = id
	}
	if kind == Vehicle {
		m.Berth = ev.berth
		m.Enter = ev.get("inoutType") == json.Number("1")
	}
	return m
}

func (s *Source) malformed(kind Kind, flaw Flaw) Message {
	if kind == Heartbeat && (flaw == FlawBadInoutType || flaw == FlawBadCredibility) {
		flaw = FlawBadPicType
	}
	ev := s.event(kind)
	switch flaw {
	case FlawBadInoutType:
		ev.set("inoutType", json.Number("7"))
	case FlawBadCredibility:
		ev.set("plateCredible", "high")
	case FlawBadPicType:
		if kind == Heartbeat {
			ev.set("picType", json.Number("9"))
		} else {
			ev.set("pictures", []any{newObject("picType", json.Number("9"), "picUrl", "jieshun/x.jpg")})
		}
	case FlawEmptyPicURL:
		if kind == Heartbeat {
			ev.set("picUrl", "")
		} else {
			ev.set("pictures", []any{newObject("picType", json.Number("1"), "picUrl", "")})
		}
	case FlawMissingField:
		required := vehicleRequired
		if kind == Heartbeat {
			required = heartbeatRequired
		}
		ev.delete(required[s.rng.IntN(len(required))])
	}
	m := s.message(kind, ev, flaw)
	switch flaw {
	case FlawNotJSON:
		m.Value = m.Value[:len(m.Value)/2]
	case FlawBinary:
		m.Value = []byte{0xff, 0xfe, 'C', 'A', 'M', 0x00, 0xc3, 0x28, 0x80}
		m.MessageID = ""
	case FlawArray:
		m.Value = append(append([]byte("["), m.Value...), ']')
	case FlawEmpty:
		m.Value, m.MessageID = []byte{}, ""
	case FlawTombstone:
		m.Value, m.MessageID = nil, ""
	}
	return m
}

// The required fields (mappings/README.md).
var (
	vehicleRequired   = []string{"deviceId", "parkCode", "berthCode", "plateNo", "inoutType", "inoutTime"}
	heartbeatRequired = []string{"deviceId", "parkCode", "berthCode", "captureTime", "picType", "picUrl"}
)

var provinces = []rune("京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼")

const plateLetters = "ABCDEFGHJKLMNPQRSTUVWXYZ" // no I or O on plates

func (s *Source) event(kind Kind) *object {
	var (
		paired      bool
		pairBerth   int
		enter       bool
		pairedPlate string
	)
	if kind == Vehicle && s.cfg.Berths > 0 {
		paired = true
		pairBerth, enter, pairedPlate = s.step()
	}
	dev := s.rng.IntN(s.cfg.Devices)
	berthNo := 0
	if paired {
		dev, berthNo = pairBerth/4, pairBerth/4%10*4+pairBerth%4+1
	}
	park := fmt.Sprintf("P%04d", 1001+dev/10)
	now := s.cfg.Now()
	device := fmt.Sprintf("CAM-%04d", dev+1)
	ev := newObject(
		"messageId", s.uuid(),
		"deviceId", device,
		"parkCode", park,
	)
	if !paired {
		berthNo = dev%10*4 + s.rng.IntN(4) + 1
	}
	berthCode := fmt.Sprintf("B-%03d", berthNo)
	ev.set("berthCode", berthCode)
	ev.device = device
	ev.berth = park + "/" + berthCode
	if kind == Heartbeat {
		// Heartbeats are 5-minute snapshots: on the minute boundary.
		capture := now.Truncate(5 * time.Minute)
		ev.set("captureTime", json.Number(strconv.FormatInt(capture.UnixMilli(), 10)))
		ev.set("picType", json.Number([]string{"1", "2", "3", "3", "3", "4"}[s.rng.IntN(6)]))
		ev.set("picUrl", s.picURL(park))
		return ev
	}
	strs := s.rng.Float64() < s.cfg.StringNumberRate
	num := func(v string) any {
		if strs {
			return v
		}
		return json.Number(v)
	}
	item := strconv.FormatInt(10000+s.rng.Int64N(99_990_000), 10)
	if s.rng.IntN(100) == 0 {
		item = "73421" + strconv.FormatUint(s.rng.Uint64(), 10) // beyond int64: passed on digit for digit
	}
	ev.set("itemId", num(item))
	if paired {
		ev.set("plateNo", pairedPlate)
	} else {
		ev.set("plateNo", s.plate())
	}
	if s.rng.IntN(20) != 0 {
		ev.set("plateColor", num(strconv.Itoa(1+s.rng.IntN(5))))
	}
	inout := "0" // exit
	switch {
	case !paired:
		inout = strconv.Itoa(s.rng.IntN(2))
	case enter:
		inout = "1"
	}
	ev.set("inoutType", json.Number(inout))
	ev.set("inoutTime", json.Number(strconv.FormatInt(now.Add(-time.Duration(s.rng.IntN(3000))*time.Millisecond).UnixMilli(), 10)))
	if s.rng.IntN(30) != 0 {
		ev.set("plateCredible", num(strconv.FormatFloat(0.5+float64(s.rng.IntN(500))/1000, 'f', 3, 64)))
	}
	pics := make([]any, s.rng.IntN(4))
	for i := range pics {
		pics[i] = newObject("picType", json.Number(strconv.Itoa(1+s.rng.IntN(4))), "picUrl", s.picURL(park))
	}
	ev.set("pictures", pics)
	return ev
}

// ExamplePlate is the plate the documentation looks up (`outbox find
// --plate 粤B12345`): a regular car of the generated traffic, one plate in
// examplePlateEvery, so that the examples find rows on a dev stack within a
// minute.
const (
	ExamplePlate      = "粤B12345"
	examplePlateEvery = 200
)

func (s *Source) plate() string {
	p := s.randomPlate()
	// Drawn all the same, so that a seed's other choices stay as they were.
	s.plates++
	if s.plates%examplePlateEvery == 0 {
		return ExamplePlate
	}
	return p
}

func (s *Source) randomPlate() string {
	b := []rune{provinces[s.rng.IntN(len(provinces))], rune(plateLetters[s.rng.IntN(len(plateLetters))])}
	n := 5
	if s.rng.IntN(5) == 0 {
		n = 6 // new-energy plates are one longer
	}
	for range n {
		if s.rng.IntN(4) == 0 {
			b = append(b, rune(plateLetters[s.rng.IntN(len(plateLetters))]))
		} else {
			b = append(b, rune('0'+s.rng.IntN(10)))
		}
	}
	return string(b)
}

// picURL is relative most of the time, as the cameras send it, sometimes
// already rooted or absolute.
func (s *Source) picURL(park string) string {
	var b [8]byte
	for i := range b {
		b[i] = byte(s.rng.Uint32())
	}
	path := fmt.Sprintf("jieshun/%s/%s/%s.jpg", s.cfg.Now().Format("2006/01/02"), park, hex.EncodeToString(b[:]))
	switch s.rng.IntN(10) {
	case 0:
		return "/" + path
	case 1:
		return "https://img.example.com/" + path
	}
	return path
}

// uuid is a random (version 4) UUID from the source's generator.
func (s *Source) uuid() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := s.rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// object is a JSON object that keeps its field order, so messages read like
// the documented examples.
type object struct {
	keys   []string
	vals   map[string]any
	device string // the camera that sent it, the record key
	berth  string // parkCode/berthCode
}

func newObject(kv ...any) *object {
	o := &object{vals: map[string]any{}}
	for i := 0; i < len(kv); i += 2 {
		o.set(kv[i].(string), kv[i+1])
	}
	return o
}

func (o *object) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *object) get(k string) any { return o.vals[k] }

func (o *object) delete(k string) {
	if _, ok := o.vals[k]; !ok {
		return
	}
	delete(o.vals, k)
	for i, key := range o.keys {
		if key == k {
			o.keys = append(o.keys[:i], o.keys[i+1:]...)
			return
		}
	}
}

// MarshalJSON writes the fields in order.
func (o *object) MarshalJSON() ([]byte, error) { return o.marshal(), nil }

func (o *object) marshal() []byte {
	b := []byte{'{'}
	for i, k := range o.keys {
		if i > 0 {
			b = append(b, ',')
		}
		kb, _ := json.Marshal(k)
		b = append(b, kb...)
		b = append(b, ':')
		vb, err := json.Marshal(o.vals[k])
		if err != nil {
			panic(fmt.Sprintf("eventgen: encoding %s: %v", k, err))
		}
		b = append(b, vb...)
	}
	return append(b, '}')
}
