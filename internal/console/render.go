package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/plugins/mapping"
)

// Payload is a stored payload made fit to show: valid JSON indented, text
// as it is, anything else escaped, and in every case no byte that a
// terminal or a browser would act on (control characters, invalid UTF-8).
type Payload struct {
	// Kind is "json", "text", "binary" (not valid UTF-8) or "empty".
	Kind string
	// Text is the payload to show (see SafeText).
	Text string
	// Size is the payload's length in bytes.
	Size int
	// Shown is how many of its bytes Text covers (Size unless cut).
	Shown int
	// BadOffset is the offset of the first byte that is not UTF-8, for
	// binary payloads.
	BadOffset int
}

// Cut says whether the payload was cut to the display limit.
func (p Payload) Cut() bool { return p.Shown < p.Size }

// RenderPayload prepares b for display, showing at most limit bytes of it
// (all of it when limit <= 0).
func RenderPayload(b []byte, limit int) Payload {
	p := Payload{Size: len(b), Shown: len(b)}
	if len(b) == 0 {
		p.Kind = "empty"
		return p
	}
	if !utf8.Valid(b) {
		p.Kind = "binary"
		p.BadOffset = firstInvalid(b)
		if limit > 0 && len(b) > limit {
			b, p.Shown = b[:limit], limit
		}
		p.Text = SafeText(string(b))
		return p
	}
	if json.Valid(b) {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err == nil {
			p.Kind = "json"
			text := out.String()
			if limit > 0 && len(text) > limit {
				// Cut on a rune boundary of the indented text.
				cut := limit
				for cut > 0 && !utf8.RuneStart(text[cut]) {
					cut--
				}
				text, p.Shown = text[:cut], min(len(b), cut)
			}
			p.Text = SafeText(text)
			return p
		}
	}
	p.Kind = "text"
	if limit > 0 && len(b) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(b[cut]) {
			cut--
		}
		b, p.Shown = b[:cut], cut
	}
	p.Text = SafeText(string(b))
	return p
}

func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// SafeText returns s with everything a terminal or a browser could act on,
// or that could not be shown, written as an escape: bytes that are not
// UTF-8 as \xNN, control and format characters (escape sequences,
// right-to-left overrides) and other unprintable runes as \u{NNNN}, and a
// backslash as \\ when anything was escaped, so the result reads back
// unambiguously. Newlines and tabs are kept. Printable text, Chinese
// included, is unchanged.
func SafeText(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || (!unicode.IsPrint(r) && r != '\n' && r != '\t') {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n' || r == '\t' || (unicode.IsPrint(r) && r != utf8.RuneError):
			b.WriteString(s[i : i+n])
		default:
			fmt.Fprintf(&b, `\u{%04x}`, r)
		}
		i += n
	}
	return b.String()
}

// SafeLine is SafeText for one line of a table or a label: newlines, tabs
// and carriage returns are escaped too (\n, \t, \r), so a value cannot
// break the layout it is printed in.
func SafeLine(s string) string {
	s = SafeText(s)
	if !strings.ContainsAny(s, "\n\t\r") {
		return s
	}
	return strings.NewReplacer("\n", `\n`, "\t", `\t`, "\r", `\r`).Replace(s)
}

// SafeBytes is SafeText for a byte string (a Kafka key).
func SafeBytes(b []byte) string { return SafeText(string(b)) }

// MaskedCredentials open the previewed body where the output adds the real
// ones at send time.
const MaskedCredentials = `"access_name":"***","access_pwd":"***"`

// Preview is the request body the current mapping would send for a row.
type Preview struct {
	// Mapping is the Bloblang file that was run.
	Mapping string
	// Body is the indented JSON body with the credentials masked, empty
	// when Err is set.
	Body string
	// Err says why there is no body: the mapping's error as the pipeline
	// would record it ("mapping: inoutType 7 is not 0 or 1"), or why the
	// mapping could not be run.
	Err string
}

// PreviewRequest runs the mapping for the row's api_type, read now from
// mappingsDir (<api_type in lower case>.blobl, as pipelines/forwarder.yaml
// names them), on the stored payload with the metadata the dispatcher gives
// it, and returns the body with the credentials masked. Nothing is sent and
// the credentials are never read: the body shows "***" where the
// http_forwarder output puts them. Times follow PLATFORM_TZ of this process.
func PreviewRequest(mappingsDir string, rec outboxdb.Record) Preview {
	file := filepath.Join(mappingsDir, strings.ToLower(rec.APIType)+".blobl")
	p := Preview{Mapping: file}
	exec, err := mapping.CompileFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			p.Err = fmt.Sprintf("api_type %s has no mapping: %s does not exist (set --mappings to the mappings directory)", SafeText(rec.APIType), file)
		} else {
			p.Err = SafeText(err.Error())
		}
		return p
	}
	msg := service.NewMessage(rec.Payload)
	msg.MetaSetMut("message_key", rec.MessageKey)
	msg.MetaSetMut("api_type", rec.APIType)
	msg.MetaSetMut("outbox_id", strconv.FormatInt(rec.ID, 10))
	res, err := msg.BloblangQuery(exec)
	if err != nil {
		p.Err = "mapping: " + SafeText(mapping.ErrorReason(err))
		return p
	}
	if res == nil {
		p.Err = "the mapping deleted the message: nothing would be sent"
		return p
	}
	body, err := res.AsBytes()
	if err != nil {
		p.Err = SafeText(err.Error())
		return p
	}
	body = bytes.TrimSpace(body)
	if len(body) < 2 || body[0] != '{' {
		p.Err = "the mapping's result is not a JSON object: " + SafeText(string(body))
		return p
	}
	masked := []byte("{" + MaskedCredentials)
	if rest := bytes.TrimSpace(body[1:]); len(rest) > 0 && rest[0] != '}' {
		masked = append(masked, ',')
	}
	masked = append(masked, body[1:]...)
	var out bytes.Buffer
	if err := json.Indent(&out, masked, "", "  "); err != nil {
		p.Err = SafeText(err.Error())
		return p
	}
	p.Body = SafeText(out.String())
	return p
}
