package console

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var indentSamples = []string{
	`{}`, `[]`, `0`, `"x"`, `null`, `{"a":1}`, `[1,2,3]`, `{"a":{},"b":[],"c":[{}]}`,
	" { \"a\" : [ 1 , { \"b\" : \"c\\\"]}\" } ] ,\n\t\"d\":true }",
	`{"plateNo":"粤B12345","s":"\u001b\\\/","n":-1.5e10,"f":false}`,
	`[[[[[[1]]]]],[[2]]]`,
}

// TestIndentJSON: with room enough, indentJSON writes what json.Indent
// writes; cut anywhere, a prefix of it; past maxDepth, {…} and […].
func TestIndentJSON(t *testing.T) {
	t.Parallel()
	for _, in := range indentSamples {
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(in), "", "  "); err != nil {
			t.Fatal(err)
		}
		got, consumed, collapsed := indentJSON([]byte(in), 1<<20, 1000, false)
		if string(got) != want.String() || consumed != len(in) || collapsed {
			t.Errorf("indentJSON(%q) = %q, %d, %v; want %q, %d", in, got, consumed, collapsed, want.String(), len(in))
		}
		for limit := range want.Len() {
			got, consumed, _ := indentJSON([]byte(in), limit, 1000, false)
			if !strings.HasPrefix(want.String(), string(got)) || len(got) > limit || consumed > len(in) {
				t.Errorf("indentJSON(%q, limit %d) = %q (consumed %d): not a prefix within the limit", in, limit, got, consumed)
			}
		}
	}
	got, _, collapsed := indentJSON([]byte(`{"a":[[1],{"b":2}],"c":{}}`), 1<<20, 2, false)
	if want := "{\n  \"a\": [\n    […],\n    {…}\n  ],\n  \"c\": {}\n}"; string(got) != want || !collapsed {
		t.Errorf("depth 2: %q, want %q", got, want)
	}
}

// FuzzIndentJSON: indentJSON agrees with json.Indent on any valid JSON.
func FuzzIndentJSON(f *testing.F) {
	for _, s := range indentSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if !json.Valid(in) {
			return
		}
		var want bytes.Buffer
		if err := json.Indent(&want, in, "", "  "); err != nil {
			t.Fatal(err)
		}
		if got, consumed, _ := indentJSON(in, want.Len()+1, 20000, false); !bytes.Equal(got, want.Bytes()) || consumed != len(in) {
			t.Errorf("indentJSON(%q) = %q, want %q", in, got, want.Bytes())
		}
	})
}
