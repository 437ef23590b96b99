package console

import (
	"fmt"
	"math/bits"
	"unicode"
	"unicode/utf8"
)

// Rendering bounds (docs/guarantees.md, "bounded rendering"): a stored row
// is shown within these whatever its shape, and what was cut is said.
const (
	// PayloadLimit is how many bytes of a payload (indented, for JSON) a
	// page or `outbox show` shows.
	PayloadLimit = 256 << 10
	// MaxDepth is the deepest nesting shown: a JSON object or array deeper
	// than that is shown as {…} or […]. It also bounds indentation to
	// 2 × MaxDepth spaces a line.
	MaxDepth = 32
)

// indentJSON writes in, valid JSON, indented as json.Indent does with two
// spaces and escaped as SafeText does (backslashes doubled when
// doubleBackslash), but streaming: it stops once limit bytes are written,
// and shows values nested deeper than maxDepth as {…} / […]. It returns
// the indented text, how many bytes of in it covers, and whether a value
// was collapsed.
// Work and memory are bounded by limit and one pass over in, where
// json.Indent expands the whole input first (a 200 KB payload nested 2000
// deep indents to gigabytes).
func indentJSON(in []byte, limit, maxDepth int, doubleBackslash bool) (out []byte, consumed int, collapsed bool) {
	x := indenter{in: in, limit: limit, double: doubleBackslash, out: make([]byte, 0, min(limit, 2*len(in)+64))}
	consumed = x.run(maxDepth)
	return x.out, consumed, x.collapsed
}

type indenter struct {
	in        []byte
	out       []byte
	limit     int
	full      bool
	collapsed bool
	double    bool
}

func (x *indenter) run(maxDepth int) int {
	in := x.in
	depth := 0
	opened := false // the last token opened an object or array
	for i := 0; i < len(in); {
		if x.full {
			return i
		}
		c := in[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			i++
			continue
		}
		first := opened
		opened = false
		if first && c != '}' && c != ']' {
			x.newline(depth)
		}
		switch c {
		case '{', '[':
			if depth >= maxDepth {
				end := skipValue(in, i)
				x.write([]byte{c})
				x.write([]byte("…"))
				x.write([]byte{closing(c)})
				x.collapsed = true
				if x.full {
					return i
				}
				i = end
				continue
			}
			x.write([]byte{c})
			depth++
			opened = true
			i++
		case '}', ']':
			depth--
			if !first {
				x.newline(depth)
			}
			x.write([]byte{c})
			i++
		case ',':
			x.write([]byte(","))
			x.newline(depth)
			i++
		case ':':
			x.write([]byte(": "))
			i++
		default: // a string, a number, true, false, null: copied as written
			end := i + 1
			if c == '"' {
				end = stringEnd(in, i)
			} else {
				for end < len(in) && !isDelimiter(in[end]) {
					end++
				}
			}
			var n int
			x.out, n = appendSafe(x.out, in[i:end], x.limit, x.double)
			if n < end-i {
				x.full = true
				return i + n
			}
			i = end
		}
	}
	return len(in)
}

// write appends s, or as much of it as fits within the limit (cut on a
// rune boundary), and returns how many bytes of s it wrote.
func (x *indenter) write(s []byte) int {
	room := x.limit - len(x.out)
	if len(s) <= room {
		x.out = append(x.out, s...)
		return len(s)
	}
	for room > 0 && !utf8.RuneStart(s[room]) {
		room--
	}
	x.out = append(x.out, s[:max(room, 0)]...)
	x.full = true
	return max(room, 0)
}

func (x *indenter) newline(depth int) {
	x.write([]byte("\n"))
	for n := 2 * depth; n > 0 && !x.full; n -= len(spaces) {
		x.write(spaces[:min(n, len(spaces))])
	}
}

var spaces = []byte("                                                                ")

func closing(open byte) byte {
	if open == '{' {
		return '}'
	}
	return ']'
}

func isDelimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// stringEnd returns the index just past the string that opens at in[i].
func stringEnd(in []byte, i int) int {
	for j := i + 1; j < len(in); j++ {
		switch in[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(in)
}

// skipValue returns the index just past the object or array that opens at
// in[i].
func skipValue(in []byte, i int) int {
	depth := 0
	for j := i; j < len(in); j++ {
		switch in[j] {
		case '"':
			j = stringEnd(in, j) - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(in)
}

// sizeText is n bytes for people: "900 bytes", "12.5 KiB", "1.2 MiB".
func sizeText(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// isClean says whether s shows as it is (SafeText returns it unchanged);
// with jsonSpace, a carriage return (whitespace between JSON tokens, never
// shown) counts as clean too.
func isClean(s []byte, jsonSpace bool) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if !printable(r) && !(jsonSpace && r == '\r') {
			return false
		}
		i += n
	}
	return true
}

// printable says whether r is shown as it is: a printable rune (U+FFFD
// aside, which stands for bad bytes), a newline or a tab.
func printable(r rune) bool {
	return r == '\n' || r == '\t' || (unicode.IsPrint(r) && r != utf8.RuneError)
}

// appendSafe appends s to dst escaped as SafeText does (bytes that are not
// UTF-8 as \xNN, unprintable runes as \u{NNNN}, backslashes doubled when
// doubleBackslash) while dst stays within limit bytes, and returns dst and
// how many bytes of s it took: whole runes only.
func appendSafe(dst, s []byte, limit int, doubleBackslash bool) ([]byte, int) {
	const hex = "0123456789abcdef"
	var buf [16]byte
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRune(s[i:])
		var piece []byte
		switch {
		case r == utf8.RuneError && n == 1:
			piece = append(buf[:0], '\\', 'x', hex[s[i]>>4], hex[s[i]&15])
		case r == '\\' && doubleBackslash:
			piece = append(buf[:0], '\\', '\\')
		case printable(r):
			piece = s[i : i+n]
		default:
			piece = append(buf[:0], '\\', 'u', '{')
			for shift := max(12, (bits.Len32(uint32(r))+3)/4*4-4); shift >= 0; shift -= 4 {
				piece = append(piece, hex[(r>>shift)&15])
			}
			piece = append(piece, '}')
		}
		if len(dst)+len(piece) > limit {
			break
		}
		dst = append(dst, piece...)
		i += n
	}
	return dst, i
}
