package outboxcli

import (
	"encoding/json"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

// writeJSON encodes v (indented or one line) with every character a
// terminal could act on written as an escape: encoding/json already escapes
// the C0 controls inside strings, but leaves DEL, the C1 controls (U+009B
// opens a control sequence on many terminals) and format characters such as
// U+202E as they are. The escapes change no JSON value: a stored message key
// that carries an escape sequence reads back the same, and never reaches
// the terminal raw.
func writeJSON(w io.Writer, v any, indent bool) error {
	enc := json.NewEncoder(terminalSafeWriter{w})
	if indent {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// terminalSafeWriter passes each write through terminalSafeJSON; an
// Encoder writes one whole value a call.
type terminalSafeWriter struct{ w io.Writer }

func (s terminalSafeWriter) Write(p []byte) (int, error) {
	if _, err := s.w.Write(terminalSafeJSON(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// terminalSafeJSON rewrites the unprintable characters of encoded JSON as
// \uXXXX. Outside strings encoded JSON holds only ASCII punctuation,
// literals and whitespace, so every such character is inside a string.
func terminalSafeJSON(b []byte) []byte {
	unsafeAt := func(r rune) bool {
		if r < utf8.RuneSelf {
			return r == 0x7f
		}
		return !unicode.IsPrint(r)
	}
	first := -1
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if unsafeAt(r) {
			first = i
			break
		}
		i += n
	}
	if first < 0 {
		return b
	}
	out := append(make([]byte, 0, len(b)+32), b[:first]...)
	for i := first; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		i += n
		switch {
		case !unsafeAt(r):
			out = utf8.AppendRune(out, r)
		case r > 0xFFFF:
			r -= 0x10000
			out = fmt.Appendf(out, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}
