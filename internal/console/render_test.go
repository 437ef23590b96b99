package console_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
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
