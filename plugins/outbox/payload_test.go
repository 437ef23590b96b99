package outbox

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestInspectPayload(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	tooDeep := strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1)
	for _, tc := range []struct {
		in, reason, key string
	}{
		{in: `{"messageId":"a"}`, key: "a"},
		{in: " \t\r\n{ \"messageId\" : \"a\" } \n", key: "a"},
		{in: `{"messageId":42}`, key: "42"},
		{in: `{"messageId":-1.5e+3}`, key: "-1.5e+3"},
		{in: `{"messageId":"\u00e9\n"}`, key: "é\n"},
		{in: `{"a":{"messageId":"inner"},"b":["messageId"],"messageId":"outer"}`, key: "outer"},
		{in: `{"messageId":"first","messageId":"last"}`, key: "last"},
		{in: `{"MessageId":"x","messageid":"y"}`, key: ""},
		{in: `{"message\u0049d":"escaped"}`, key: "escaped"},
		{in: `{"messageId":""}`, key: ""},
		{in: `{"messageId":null}`, key: ""},
		{in: `{"messageId":true}`, key: ""},
		{in: `{}`, key: ""},
		{in: `{"x":"` + "粤B12345" + `"}`, key: ""},
		{in: `{"d":` + deep + `}`, reason: "payload is not valid JSON: invalid character '[' exceeded max depth"},
		{in: deep, reason: "payload is a JSON array, not an object"},
		{in: tooDeep, reason: "payload is not valid JSON: invalid character '[' exceeded max depth"},
		{in: ``, reason: "payload is empty"},
		{in: `[]`, reason: "payload is a JSON array, not an object"},
		{in: ` "s" `, reason: "payload is a JSON string, not an object"},
		{in: `12`, reason: "payload is a JSON number, not an object"},
		{in: `null`, reason: "payload is a JSON null, not an object"},
		{in: `false`, reason: "payload is a JSON boolean, not an object"},
		{in: `{"a":1,}`, reason: "payload is not valid JSON: invalid character '}' looking for beginning of object key string"},
		{in: `{"a":1} {}`, reason: "payload is not valid JSON: invalid character '{' after top-level value"},
		{in: `{"a":01}`, reason: "payload is not valid JSON: invalid character '1' after object key:value pair"},
		{in: "{\"a\":\"tab\there\"}", reason: "payload is not valid JSON: invalid character '\\t' in string literal"},
		{in: `{"a":"\x"}`, reason: `payload is not valid JSON: invalid character 'x' in string escape code`},
		{in: `{"a":tru}`, reason: "payload is not valid JSON: invalid character '}' in literal true (expecting 'e')"},
		{in: "{\"a\":\"\xff\"}", reason: "payload is not valid UTF-8 (first bad byte at offset 6)"},
	} {
		reason, id := inspectPayload([]byte(tc.in), 1<<20)
		name := tc.in
		if len(name) > 40 {
			name = name[:40] + "…"
		}
		if reason != tc.reason {
			t.Errorf("%q: reason %q, want %q", name, reason, tc.reason)
			continue
		}
		if reason != "" {
			continue
		}
		key, ok, _ := id[memberMessageID].key()
		if key != tc.key || ok != (tc.key != "") {
			t.Errorf("%q: key %q (%v), want %q", name, key, ok, tc.key)
		}
	}
	if reason, _ := inspectPayload([]byte(`{"a":"bcd"}`), 5); reason != "payload is 11 bytes, larger than max_payload_bytes (5)" {
		t.Errorf("size limit: %q", reason)
	}
}

// FuzzScanJSON holds the scanner to encoding/json: it accepts exactly what
// json.Valid accepts, and finds the messageId that decoding into a map finds
// (exact name, last one wins).
//
//	go test ./plugins/outbox -run '^$' -fuzz FuzzScanJSON -fuzztime 60s
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{
		`{"messageId":"a"}`, `{"messageId":1,"messageId":[1,{"a":null}]}`, `[1,2.5e-3,true,false,null,"x\u1234"]`,
		`{"a":{"b":{"c":[]}}}`, ` {} `, `{"a" :1 , "b":-0.0E+1}`, `"\ud800"`, `{"a":"\"\\\/\b\f\n\r\t"}`,
		`{`, `{"a"}`, `[1,]`, `01`, `1.`, `-`, `tru`, `nul`, "\"\x01\"", `{"message\u0049d":"x"}`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := scanner{b: b}
		got, want := s.scan(), json.Valid(b)
		if got != want {
			t.Fatalf("scanner says valid=%v, json.Valid says %v for %q", got, want, b)
		}
		if !got || s.topKind != '{' || !utf8.Valid(b) {
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("valid object does not decode: %v", err)
		}
		for i, name := range memberNames {
			v, found := m[name]
			got := s.members[i]
			if found != got.found || (found && !bytes.Equal(v, got.raw)) {
				t.Fatalf("%s: scanner %q (%v), encoding/json %q (%v) in %q", name, got.raw, got.found, v, found, b)
			}
		}
	})
}
