package httpforwarder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html"
	"slices"
	"strings"
	"unicode/utf8"
)

// redactor blanks the credentials out of everything a reply may echo back
// before it is cut, stored, logged or counted (docs/guarantees.md #11).
// Platforms repeat the request in whatever encoding their libraries chose:
// JSON with "/" escaped (PHP), with `\"` next to a raw "&" (Jackson), with
// every non-ASCII character as \u00e4 (Python), URL-encoded with "+" for a
// space, as HTML entities, in base64, inside a JSON string inside JSON.
//
// Three passes over every reply text, each linear in its length, with
// what they look for computed once here:
//   - the credentials as they are and in base64, replaced in one pass
//     (strings.Replacer);
//   - for text holding an escape character (\ % & +), the text decoded
//     layer by layer (JSON \-escapes, %XX, HTML entities, "+" as a space,
//     mixed freely, as a library escaping only some characters writes
//     them; JSON inside JSON), and a credential found in a layer blanked
//     out where its spelling stands in the text;
//   - base64: a credential inside a longer base64 text (the whole request
//     body encoded) lies at one of three bit offsets, and the characters
//     that encode only its bytes are the same at each; those are searched
//     for and blanked with the characters around them.
type redactor struct {
	replacer *strings.Replacer
	// decoded are the credentials as the decoding pass compares them
	// ("+" read as a space, as in the decoded text).
	decoded [][]byte
	// base64 are the characters that encode only a credential's bytes, at
	// each bit offset, in both alphabets.
	base64 []string
}

const (
	redacted = "[redacted]"
	// minBase64Core keeps the base64 pass from blanking short runs of
	// letters: a credential of a byte or two is caught by its whole
	// spellings only.
	minBase64Core = 6
)

func newRedactor(secrets ...string) *redactor {
	r := &redactor{}
	var forms []string
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range spellings(s) {
			if form != "" && !slices.Contains(forms, form) {
				forms = append(forms, form)
			}
		}
		r.decoded = append(r.decoded, []byte(strings.ReplaceAll(s, "+", " ")))
		// Base64 of the credential as it is and as the request body
		// spells it (the body is what a platform encodes whole).
		for _, form := range []string{s, jsonBody(s)} {
			for _, core := range base64Cores([]byte(form)) {
				if !slices.Contains(r.base64, core) {
					r.base64 = append(r.base64, core)
				}
			}
		}
	}
	// Longest first: at each position strings.Replacer takes the first
	// pattern, in argument order, that matches, and one spelling may begin
	// with another.
	slices.SortStableFunc(forms, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(forms))
	for _, form := range forms {
		pairs = append(pairs, form, redacted)
	}
	r.replacer = strings.NewReplacer(pairs...)
	return r
}

// text blanks the credentials out of s.
func (r *redactor) text(s string) string {
	s = r.replacer.Replace(s)
	if len(r.decoded) > 0 && strings.ContainsAny(s, `\%&+`) {
		s = r.scrubDecoded(s)
	}
	if len(r.base64) > 0 {
		s = r.scrubBase64(s)
	}
	return s
}

// reply returns a reply's parsed body and its snippet for last_error, both
// free of credentials: the whole text is scrubbed first; if a decoded
// string of the body still holds a credential (an escape nobody foresaw),
// the snippet is the scrubbed body re-encoded instead. The snippet is cut
// only after that. The whitespace around a body (the newline a plain-text
// error page ends with) is not part of a one-line reason.
func (r *redactor) reply(raw []byte, body any) (any, string) {
	snippet := r.text(strings.TrimSpace(string(raw)))
	if body != nil && len(r.decoded) > 0 {
		if clean, changed := r.scrubValue(body); changed {
			body = clean
			if b, err := json.Marshal(clean); err == nil {
				snippet = string(b)
			}
		}
	}
	return body, cut(snippet, maxSnippetBytes)
}

// scrubValue replaces credentials inside the strings (keys included) of a
// decoded JSON value.
func (r *redactor) scrubValue(v any) (any, bool) {
	switch x := v.(type) {
	case string:
		if s := r.text(x); s != x {
			return s, true
		}
		return x, false
	case []any:
		changed := false
		for i, e := range x {
			var c bool
			if x[i], c = r.scrubValue(e); c {
				changed = true
			}
		}
		return x, changed
	case map[string]any:
		changed := false
		for k, e := range x {
			clean, c := r.scrubValue(e)
			if ck := r.text(k); ck != k {
				delete(x, k)
				k, c = ck, true
			}
			x[k] = clean
			changed = changed || c
		}
		return x, changed
	default:
		return v, false
	}
}

// spellings are the ways s is written in a reply with no escape
// character (the decoding pass finds the others, mixed spellings
// included): as is, and base64 (standard and URL alphabets, padded or not)
// of s and of its spelling in the request body.
func spellings(s string) []string {
	out := []string{s}
	for _, form := range []string{s, jsonBody(s)} {
		b := []byte(form)
		out = append(out, base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
			base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b))
	}
	return out
}

// jsonBody is s as encoding/json writes it into the request body (between
// the quotes): the spelling a platform echoes when it encodes the body.
func jsonBody(s string) string {
	q, _ := json.Marshal(s)
	return string(q[1 : len(q)-1])
}

// base64Cores returns, for each bit offset a credential may start at in a
// longer base64 text and for both alphabets, the characters that encode
// its bytes alone (the first and last may be shared with its neighbours).
func base64Cores(secret []byte) []string {
	var out []string
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for offset := range 3 {
			stream := make([]byte, offset, offset+len(secret)+2)
			stream = append(stream, secret...)
			encoded := enc.EncodeToString(stream)
			first := (8*offset + 5) / 6            // first character with no bit before the credential
			last := 8 * (offset + len(secret)) / 6 // characters before it have no bit after it
			if last-first >= minBase64Core && !slices.Contains(out, encoded[first:last]) {
				out = append(out, encoded[first:last])
			}
		}
	}
	return out
}

// scrubBase64 blanks each run of base64 characters that encodes a
// credential, the character on each side (which holds some of its bits)
// and any padding included.
func (r *redactor) scrubBase64(s string) string {
	var spans [][2]int
	for _, core := range r.base64 {
		for from := 0; ; {
			i := strings.Index(s[from:], core)
			if i < 0 {
				break
			}
			start, end := from+i, from+i+len(core)
			if start > 0 && isBase64Char(s[start-1]) {
				start--
			}
			if end < len(s) && isBase64Char(s[end]) {
				end++
			}
			for end < len(s) && s[end] == '=' {
				end++
			}
			spans = append(spans, [2]int{start, end})
			from = from + i + len(core)
		}
	}
	return replaceSpans(s, spans)
}

func isBase64Char(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+/-_", c) >= 0
}

// maxLayers is how deep scrubDecoded decodes: the request body as a JSON
// string inside a JSON error message inside a JSON reply is three.
const maxLayers = 4

// scrubDecoded finds the credentials in s decoded up to maxLayers deep and
// blanks the text that spells them. A layer is decoded only while the one
// before it changed something and still holds an escape character.
func (r *redactor) scrubDecoded(s string) string {
	// Replies seldom echo a credential: look for one first, cheaply, and
	// track where each decoded byte came from only when there is one.
	if !r.inDecoded([]byte(s)) {
		return s
	}
	// Layer 1: each byte of s stands for itself.
	in := []byte(s)
	starts, ends := make([]int32, len(in)), make([]int32, len(in))
	for i := range in {
		starts[i], ends[i] = int32(i), int32(i+1)
	}
	var spans [][2]int
	for layer := 0; layer < maxLayers; layer++ {
		out, outStarts, outEnds, changed := decodeLayer(in, starts, ends)
		if !changed {
			break
		}
		for _, secret := range r.decoded {
			for from := 0; ; {
				i := bytes.Index(out[from:], secret)
				if i < 0 {
					break
				}
				k := from + i
				spans = append(spans, [2]int{int(outStarts[k]), int(outEnds[k+len(secret)-1])})
				from = k + len(secret)
			}
		}
		if !bytes.ContainsAny(out, `\%&`) {
			break
		}
		in, starts, ends = out, outStarts, outEnds
	}
	return replaceSpans(s, spans)
}

// inDecoded says whether a credential is in one of the layers of in, as
// scrubDecoded decodes them.
func (r *redactor) inDecoded(in []byte) bool {
	for range maxLayers {
		out, changed := decodeLayerFast(in)
		if !changed {
			return false
		}
		for _, secret := range r.decoded {
			if bytes.Contains(out, secret) {
				return true
			}
		}
		if !bytes.ContainsAny(out, `\%&`) {
			return false
		}
		in = out
	}
	return false
}

// decodeLayerFast is decodeLayer without the spans.
func decodeLayerFast(in []byte) (out []byte, changed bool) {
	out = make([]byte, 0, len(in))
	var buf [8]byte
	for i := 0; i < len(in); {
		c := in[i]
		if !escapeStart[c] {
			out = append(out, c)
			i++
			continue
		}
		decoded, n := decodeUnit(in[i:], buf[:0])
		if n == 0 {
			decoded, n = in[i:i+1], 1
		}
		for _, d := range decoded {
			if d == '+' {
				d = ' '
			}
			out = append(out, d)
		}
		changed = changed || n > 1 || c == '+'
		i += n
	}
	return out, changed
}

// escapeStart marks the bytes an escape decodeUnit knows begins with, and
// "+".
var escapeStart = [256]bool{'\\': true, '%': true, '&': true, '+': true}

// decodeLayer decodes one layer of escapes in in: JSON (\uXXXX with
// surrogate pairs, \xXX, \/ \" \\ \' \b \f \n \r \t), URL (%XX, %uXXXX,
// "+"), HTML entities (&name; &#N; &#xN;). Every "+", written or decoded,
// becomes a space, as it does in the compared credentials. starts and ends
// give, for each byte of in, the span of the original text it came from;
// the result carries the same for each decoded byte.
func decodeLayer(in []byte, starts, ends []int32) (out []byte, outStarts, outEnds []int32, changed bool) {
	out = make([]byte, 0, len(in))
	outStarts, outEnds = make([]int32, 0, len(in)), make([]int32, 0, len(in))
	emit := func(decoded []byte, from, to int) {
		for _, c := range decoded {
			if c == '+' {
				c, changed = ' ', true
			}
			out = append(out, c)
			outStarts = append(outStarts, starts[from])
			outEnds = append(outEnds, ends[to-1])
		}
	}
	var buf [8]byte
	for i := 0; i < len(in); {
		decoded, n := decodeUnit(in[i:], buf[:0])
		if n == 0 {
			emit(in[i:i+1], i, i+1)
			i++
			continue
		}
		changed = true
		emit(decoded, i, i+n)
		i += n
	}
	return out, outStarts, outEnds, changed
}

// decodeUnit decodes the escape at the start of s into buf and returns it
// and its length in s; n is 0 when s does not start with one ("+" is left
// to emit).
func decodeUnit(s, buf []byte) (decoded []byte, n int) {
	if len(s) < 2 {
		return nil, 0
	}
	switch s[0] {
	case '\\':
		switch s[1] {
		case 'u':
			return utf16Unit(s, buf)
		case 'x':
			c, ok := hexValue(s[2:], 2)
			if !ok {
				return nil, 0
			}
			return utf8.AppendRune(buf, rune(c)), 4
		}
		if i := strings.IndexByte(`/"\'bfnrt`, s[1]); i >= 0 {
			return append(buf, "/\"\\'\b\f\n\r\t"[i]), 2
		}
	case '%':
		if s[1] == 'u' {
			return utf16Unit(s, buf)
		}
		if c, ok := hexValue(s[1:], 2); ok {
			return append(buf, byte(c)), 3
		}
	case '&':
		end := bytes.IndexByte(s[:min(len(s), 12)], ';')
		if end < 2 {
			return nil, 0
		}
		entity := string(s[:end+1])
		if u := html.UnescapeString(entity); u != entity {
			return append(buf, u...), end + 1
		}
	}
	return nil, 0
}

// utf16Unit decodes \uXXXX (JSON) or %uXXXX (JavaScript's escape()) at
// the start of s, with the low half of a surrogate pair written the same
// way after it.
func utf16Unit(s, buf []byte) ([]byte, int) {
	c, ok := hexValue(s[2:], 4)
	if !ok {
		return nil, 0
	}
	n := 6
	if c >= 0xD800 && c < 0xDC00 && len(s) >= 12 && s[6] == s[0] && s[7] == 'u' {
		if lo, ok := hexValue(s[8:], 4); ok && lo >= 0xDC00 && lo < 0xE000 {
			c, n = 0x10000+(c-0xD800)<<10+(lo-0xDC00), 12
		}
	}
	return utf8.AppendRune(buf, rune(c)), n
}

func hexValue(s []byte, digits int) (uint32, bool) {
	if len(s) < digits {
		return 0, false
	}
	var v uint32
	for _, c := range s[:digits] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint32(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | uint32(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// replaceSpans replaces each span of s (merged where they touch) with
// redacted.
func replaceSpans(s string, spans [][2]int) string {
	if len(spans) == 0 {
		return s
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	var b strings.Builder
	at := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] <= end; i++ {
			end = max(end, spans[i][1])
		}
		b.WriteString(s[at:start])
		b.WriteString(redacted)
		at = end
	}
	b.WriteString(s[at:])
	return b.String()
}

// cut shortens s to at most n bytes on a rune boundary, marking a cut with
// "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
