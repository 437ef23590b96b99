package httpforwarder

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// redactor blanks the credentials out of everything a reply may echo back
// before it is stored, logged or counted: platforms that repeat the request
// in an error message do so in whatever encoding their JSON library chose
// (PHP escapes "/" as "\/", Python escapes every non-ASCII character as
// "\u00e4"), so the credentials are searched for in each of those spellings,
// and in the decoded string values of a JSON reply, before the reply is cut
// to a snippet (a credential across the cut would otherwise keep its
// prefix).
type redactor struct {
	secrets  []string
	replacer *strings.Replacer
}

const redacted = "[redacted]"

func newRedactor(secrets ...string) *redactor {
	r := &redactor{}
	var pairs []string
	seen := map[string]bool{}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		r.secrets = append(r.secrets, s)
		for _, form := range spellings(s) {
			if form != "" && !seen[form] {
				seen[form] = true
				pairs = append(pairs, form, redacted)
			}
		}
	}
	r.replacer = strings.NewReplacer(pairs...)
	return r
}

// spellings are the ways a JSON encoder may write s inside a string: as is,
// with encoding/json's escapes, with "/" escaped (PHP), and with every
// non-ASCII character escaped (Python's ensure_ascii), lower- and upper-case.
func spellings(s string) []string {
	q, _ := json.Marshal(s)
	std := string(q[1 : len(q)-1])
	ascii := asciiEscape(std, false)
	return []string{
		s, std,
		strings.ReplaceAll(std, "/", `\/`),
		ascii, asciiEscape(std, true),
		strings.ReplaceAll(ascii, "/", `\/`),
	}
}

// asciiEscape writes every non-ASCII character of an encoded JSON string as
// \uXXXX (surrogate pairs beyond the BMP).
func asciiEscape(s string, upper bool) string {
	format := "\\u%04x"
	if upper {
		format = "\\u%04X"
	}
	var b strings.Builder
	for _, c := range s {
		switch {
		case c < utf8.RuneSelf:
			b.WriteRune(c)
		case c > 0xFFFF:
			c -= 0x10000
			b.WriteString(fmt.Sprintf(format, 0xD800+(c>>10)))
			b.WriteString(fmt.Sprintf(format, 0xDC00+(c&0x3FF)))
		default:
			b.WriteString(fmt.Sprintf(format, c))
		}
	}
	return b.String()
}

// text blanks the credentials out of s.
func (r *redactor) text(s string) string { return r.replacer.Replace(s) }

// reply returns a reply's parsed body and its snippet for last_error, both
// free of credentials: every spelling is replaced in the raw text first; if
// a decoded string of the body still holds a credential (an escape nobody
// foresaw), the snippet is the scrubbed body re-encoded instead. The
// snippet is cut only after that.
func (r *redactor) reply(raw []byte, body any) (any, string) {
	snippet := r.text(string(raw))
	if body != nil && len(r.secrets) > 0 {
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
