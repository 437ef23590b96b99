package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// member names a top-level payload member that ingest reads.
type member int

const (
	memberMessageID member = iota
	memberPlateNo
	memberParkCode
	memberBerthCode
	memberDeviceID
	memberCount
)

// memberNames are the payload members ingest reads: the idempotency key, and
// what operators look rows up by (docs/operations.md, outbox find) and what
// orders vehicle events per berth.
var memberNames = [memberCount]string{"messageId", "plateNo", "parkCode", "berthCode", "deviceId"}

// members holds the raw JSON values of the top-level members of a payload
// that ingest reads.
type members [memberCount]rawValue

// rawValue is the raw JSON value of one member; found is false when the
// payload has no such member.
type rawValue struct {
	raw   []byte
	found bool
}

// inspectPayload says why raw cannot be forwarded (reason, "" when it can)
// and finds its top-level members of interest. raw must be a non-empty JSON
// object of valid UTF-8, no larger than maxBytes; the checks run cheapest
// first, so an oversized payload is never parsed.
//
// Validation and the member search are one pass of a small scanner
// (scanJSON) rather than json.Valid plus a decode: this runs for every
// message on the ingest path, and json.Valid alone used to cost more than
// everything else the processor does per message. The scanner accepts
// exactly what json.Valid accepts (FuzzScanJSON checks that), so what is
// stored PENDING is what the mappings can parse.
func inspectPayload(raw []byte, maxBytes int) (reason string, m members) {
	switch {
	case len(raw) == 0:
		return "payload is empty", m
	case len(raw) > maxBytes:
		return fmt.Sprintf("payload is %d bytes, larger than max_payload_bytes (%d)", len(raw), maxBytes), m
	case !utf8.Valid(raw):
		return fmt.Sprintf("payload is not valid UTF-8 (first bad byte at offset %d)", firstInvalidUTF8(raw)), m
	}
	s := scanner{b: raw}
	if !s.scan() {
		// The scanner says no more than that; encoding/json names the problem.
		var v json.RawMessage
		err := json.Unmarshal(raw, &v)
		if err != nil {
			return fmt.Sprintf("payload is not valid JSON: %v", err), m
		}
		// Unreachable while the scanner matches json.Valid; if it ever does
		// not, trust encoding/json rather than fail a good message.
		var o map[string]json.RawMessage
		if json.Unmarshal(raw, &o) != nil {
			return fmt.Sprintf("payload is a JSON %s, not an object", jsonKind(raw[skipSpace(raw, 0)])), m
		}
		for i, name := range memberNames {
			if v, ok := o[name]; ok {
				m[i] = rawValue{raw: v, found: true}
			}
		}
		return "", m
	}
	if s.topKind != '{' {
		return fmt.Sprintf("payload is a JSON %s, not an object", jsonKind(s.topKind)), m
	}
	return "", s.members
}

// key returns the messageId as a key: a string's value or a number's text.
// ok is false when it is missing, null or an empty string; why then says
// what was found.
func (v rawValue) key() (key string, ok bool, why string) {
	if !v.found {
		return "", false, "no messageId"
	}
	switch kind := jsonKind(v.raw[0]); kind {
	case "string":
		s, ok := v.text()
		if !ok {
			return "", false, "messageId is not a readable string"
		}
		if s == "" {
			return "", false, "messageId is empty"
		}
		return s, true, ""
	case "number":
		return string(v.raw), true, ""
	case "null":
		return "", false, "messageId is null"
	default:
		return "", false, "messageId is a JSON " + kind + ", not a string or number"
	}
}

// text returns a string member's value, or a number's text; ok is false for
// any other kind of value and for a missing member.
func (v rawValue) text() (string, bool) {
	if !v.found || len(v.raw) == 0 {
		return "", false
	}
	switch jsonKind(v.raw[0]) {
	case "number":
		return string(v.raw), true
	case "string":
	default:
		return "", false
	}
	if bytes.IndexByte(v.raw, '\\') < 0 {
		return string(v.raw[1 : len(v.raw)-1]), true
	}
	var s string
	if err := json.Unmarshal(v.raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// maxLookupBytes caps a looked-up member's value (plate, park, berth,
// device) as stored for lookups: a longer value is a broken producer, and
// it would only bloat the lookup indexes.
const maxLookupBytes = 128

// lookup returns a member's value for a lookup column: its text, cleaned
// for a text column and capped; "" when it is absent or not text.
func (v rawValue) lookup() string {
	s, ok := v.text()
	if !ok || s == "" {
		return ""
	}
	return outboxdb.CleanText(s, maxLookupBytes)
}

// maxDepth is encoding/json's nesting limit, kept so that both accept the
// same documents.
const maxDepth = 10000

// scanner validates one JSON document and, when it is an object, keeps the
// raw values of its last top-level members named in memberNames (Bloblang,
// which the mappings use, also lets the last of repeated names win, and
// matches names exactly, where encoding/json would accept "messageid").
type scanner struct {
	b []byte
	i int

	depth   int
	topKind byte
	members members
}

func (s *scanner) scan() bool {
	s.ws()
	if s.i == len(s.b) {
		return false
	}
	s.topKind = s.b[s.i]
	if !s.value() {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) value() bool {
	if s.i == len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		return s.str()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	}
	return false
}

func (s *scanner) object() bool {
	top := s.depth == 0
	return s.container('}', func() bool { return s.member(top) })
}

func (s *scanner) array() bool {
	return s.container(']', s.value)
}

// container consumes an object or an array, whose members or elements elem
// consumes one at a time; both share the nesting limit and the separators.
func (s *scanner) container(end byte, elem func() bool) bool {
	s.depth++
	if s.depth > maxDepth {
		return false
	}
	s.i++ // '{' or '['
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == end {
		s.i++
		s.depth--
		return true
	}
	for {
		s.ws()
		if !elem() {
			return false
		}
		s.ws()
		if s.i == len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case end:
			s.i++
			s.depth--
			return true
		default:
			return false
		}
	}
}

// member consumes one "name": value of an object, keeping the value when
// the object is the top-level one and the name is in memberNames.
func (s *scanner) member(top bool) bool {
	if s.i == len(s.b) || s.b[s.i] != '"' {
		return false
	}
	kStart := s.i
	if !s.str() {
		return false
	}
	key := s.b[kStart+1 : s.i-1]
	s.ws()
	if s.i == len(s.b) || s.b[s.i] != ':' {
		return false
	}
	s.i++
	s.ws()
	vStart := s.i
	if !s.value() {
		return false
	}
	if top {
		for m, name := range memberNames {
			if keyIs(key, name) {
				s.members[m] = rawValue{raw: s.b[vStart:s.i], found: true}
				break
			}
		}
	}
	return true
}

// str consumes a string; control characters must be escaped, escapes must be
// one of JSON's. Bytes that are not UTF-8 are left to the UTF-8 check, as
// json.Valid does.
func (s *scanner) str() bool {
	s.i++ // opening quote
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			if s.i == len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if s.i+4 >= len(s.b) {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		default:
			s.i++
		}
	}
	return false
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i == len(s.b):
		return false
	case s.b[s.i] == '0':
		s.i++
	case s.b[s.i] >= '1' && s.b[s.i] <= '9':
		s.digits()
	default:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits consumes [0-9]* and reports whether there was at least one.
func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

func (s *scanner) literal(word string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return false
	}
	s.i += len(word)
	return true
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// keyIs compares a raw (still escaped) member name with name.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	var s string
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	return json.Unmarshal(quoted, &s) == nil && s == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// jsonKind names the type of the JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}
