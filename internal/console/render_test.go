package console_test

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/hostilejson"
)

func TestSafeText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, text, line string }{
		{"粤B12345 plain", "粤B12345 plain", "粤B12345 plain"},
		{"a\nb\tc", "a\nb\tc", `a\nb\tc`},
		{"\x1b[2Jclear", `\u{001b}[2Jclear`, `\u{001b}[2Jclear`},
		{"bad \xff byte", `bad \xff byte`, `bad \xff byte`},
		{"rtl \u202e override", `rtl \u{202e} override`, `rtl \u{202e} override`},
		// A backslash is doubled once anything is escaped, so the result
		// reads back unambiguously.
		{`C:\x` + "\x00", `C:\\x\u{0000}`, `C:\\x\u{0000}`},
		{"c1 \u009b csi", `c1 \u{009b} csi`, `c1 \u{009b} csi`},
	} {
		if got := console.SafeText(c.in); got != c.text {
			t.Errorf("SafeText(%q) = %q, want %q", c.in, got, c.text)
		}
		if got := console.SafeLine(c.in); got != c.line {
			t.Errorf("SafeLine(%q) = %q, want %q", c.in, got, c.line)
		}
	}
}

func TestRenderPayload(t *testing.T) {
	t.Parallel()
	p := console.RenderPayload([]byte(`{"plateNo":"粤B12345","x":"\u001b"}`), 0)
	if p.Kind != "json" || p.Text != "{\n  \"plateNo\": \"粤B12345\",\n  \"x\": \"\\u001b\"\n}" {
		t.Errorf("JSON: %+v", p)
	}
	p = console.RenderPayload([]byte("\xff\xfe\x1b[2J"), 0)
	if p.Kind != "binary" || p.BadOffset != 0 || p.Text != `\xff\xfe\u{001b}[2J` {
		t.Errorf("binary: %+v", p)
	}
	p = console.RenderPayload([]byte("not json"), 0)
	if p.Kind != "text" || p.Text != "not json" {
		t.Errorf("text: %+v", p)
	}
	if p := console.RenderPayload(nil, 0); p.Kind != "empty" {
		t.Errorf("empty: %+v", p)
	}
	big := `{"a":"` + strings.Repeat("粤", 1000) + `"}`
	p = console.RenderPayload([]byte(big), 100)
	if !p.Cut() || len(p.Text) > 100 || !utf8.ValidString(p.Text) {
		t.Errorf("cut: shown %d of %d, %d bytes of text, valid %v", p.Shown, p.Size, len(p.Text), utf8.ValidString(p.Text))
	}
}

func TestPreviewRequest(t *testing.T) {
	t.Parallel()
	rec := outboxdb.Record{ID: 7, MessageKey: "m-1", APIType: "VEHICLE_EVENT", Payload: []byte(vehicle)}
	p := console.PreviewRequest("../../mappings", rec)
	if p.Err != "" || !strings.HasPrefix(p.Body, "{\n  \"access_name\": \"***\",\n  \"access_pwd\": \"***\",\n") ||
		!strings.Contains(p.Body, `"plate_no": "粤B12345"`) || !strings.Contains(p.Body, `"credibility": "85"`) {
		t.Errorf("preview: %+v", p)
	}
	rec.Payload = []byte(`{"messageId":"m","deviceId":"d","parkCode":"p","berthCode":"b","plateNo":"x","inoutType":7,"inoutTime":1}`)
	if p := console.PreviewRequest("../../mappings", rec); p.Err != "mapping: inoutType 7 is not 0 or 1" {
		t.Errorf("mapping error: %+v", p)
	}
	rec.APIType = "PARKING_FEE"
	if p := console.PreviewRequest("../../mappings", rec); !strings.Contains(p.Err, "api_type PARKING_FEE has no mapping: ../../mappings/parking_fee.blobl does not exist") {
		t.Errorf("unknown api_type: %+v", p)
	}
}

// allocated is how many bytes f allocates (the process's, so the tests
// that call it do not run in parallel).
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRenderHostilePayloads: a payload nested 2 000 deep and payloads of
// several MiB render within bounded memory and output, saying what was
// cut (docs/guarantees.md, "bounded rendering"). Indenting the whole
// payload first, as json.Indent does, allocated 1.3 GiB and 950 MiB for
// the first two. Not parallel: it measures the process's allocations.
func TestRenderHostilePayloads(t *testing.T) {
	const maxAlloc = 4 << 20
	for _, c := range []struct {
		name    string
		payload []byte
		kind    string
		cut     bool
		notes   []string
	}{
		// Collapsed below 32 levels, the rest fits.
		{"Deep", hostilejson.Deep(2000, 40), "json", false, []string{"Nesting deeper than 32 levels not shown ({…}, […])."}},
		{"Wide", hostilejson.Wide(4<<20, 30), "json", true, []string{"… 4.0 MiB more not shown (the first 8.1 KiB of 4.0 MiB are)."}},
		{"LongString", []byte(`{"s":"` + strings.Repeat("粤", 3<<20) + `"}`), "json", true,
			[]string{"… 8.8 MiB more not shown (the first 256.0 KiB of 9.0 MiB are)."}},
		// Escapes count against the limit: 4 bytes of ESC[2J show as 11.
		{"Text", bytes.Repeat([]byte("not json \x1b[2J "), 1<<20), "text", true,
			[]string{"… 13.8 MiB more not shown (the first 170.7 KiB of 14.0 MiB are)."}},
		{"Binary", bytes.Repeat([]byte("\xff\x1b"), 4<<20), "binary", true,
			[]string{"… 8.0 MiB more not shown (the first 42.7 KiB of 8.0 MiB are)."}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p console.Payload
			n := allocated(func() { p = console.RenderPayload(c.payload, console.PayloadLimit) })
			if n > maxAlloc {
				t.Errorf("rendering %d bytes allocated %d MiB, want at most %d MiB", len(c.payload), n>>20, maxAlloc>>20)
			}
			if p.Kind != c.kind || len(p.Text) > console.PayloadLimit || !utf8.ValidString(p.Text) || p.Cut() != c.cut {
				t.Errorf("kind %s, %d bytes of text, cut %v; want %s, at most %d bytes, cut %v", p.Kind, len(p.Text), p.Cut(), c.kind, console.PayloadLimit, c.cut)
			}
			if bad := strings.IndexFunc(p.Text, func(r rune) bool { return r != '\n' && r != '\t' && !unicode.IsPrint(r) }); bad >= 0 {
				t.Errorf("the text holds %q raw", p.Text[bad:bad+1])
			}
			notes := strings.Join(p.Notes(), " ")
			for _, want := range c.notes {
				if !strings.Contains(notes, want) {
					t.Errorf("notes %q lack %q", notes, want)
				}
			}
		})
	}
}
