package mappingfile

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

// maxImportDepth bounds how deep describeParseError follows imports, should
// two files import each other.
const maxImportDepth = 16

// describeParseError says where a parse error of the mapping at path is, as
// "file:line:col: reason", for a user to open the file at that place.
//
// Bloblang reports an error inside an imported file at the import statement
// of the importing file, with the imported file's reason but neither its name
// nor its position ("vehicle_event.blobl:16:37 ...: impor" for a typo in
// common.blobl). When the error is at an import statement, the imported file
// is parsed on its own to find the error in it, and the message names that
// file and position, followed by the import chain:
//
//	mappings/common.blobl:54:11: expected  or assignment, got: {\n  l (imported by mappings/vehicle_event.blobl:17:1)
//
// The files are read again for this, so an edit made in between can make the
// message describe the newer content; the next reload reports that anyway.
func describeParseError(files FileReader, root, path, content string, perr *bloblang.ParseError) string {
	var importedBy []string
	for range maxImportDepth {
		line, col, imported, ok := locateParseError(content, perr)
		at := fmt.Sprintf("%s:%d:%d", path, line, col)
		if !ok {
			return withImporters(at+": "+oneLine(perr.Error()), importedBy)
		}
		// The error is at an import statement: the reason ends with the
		// statement's first characters, which say nothing here.
		reason := oneLine(strings.TrimSuffix(perr.Error(), ": impor"))
		name := imported
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(path), name)
		}
		if !within(root, name) {
			// Bloblang's own reason says the import was refused.
			return withImporters(at+": "+reason, importedBy)
		}
		inner, err := files.ReadFile(name)
		if err != nil {
			// Bloblang's own reason says the import cannot be read.
			return withImporters(at+": "+reason, importedBy)
		}
		env := mappingEnvironment().WithCustomImporter(importer(root, filepath.Dir(name), files.ReadFile))
		var innerErr *bloblang.ParseError
		if _, err := env.Parse(string(inner)); !errors.As(err, &innerErr) {
			// The imported file parses on its own: the import statement is
			// what is wrong (no maps in the file, a map name defined twice).
			return withImporters(at+": "+reason, importedBy)
		}
		importedBy = append([]string{at}, importedBy...)
		path, content, perr = name, string(inner), innerErr
	}
	return withImporters(path+": "+oneLine(perr.Error()), importedBy)
}

// withImporters appends the import chain, innermost importer first.
func withImporters(msg string, importedBy []string) string {
	if len(importedBy) == 0 {
		return msg
	}
	return msg + " (imported by " + strings.Join(importedBy, ", imported by ") + ")"
}

// locateParseError returns the line and column (1-based, counted in
// characters) of a parse error in content, and, when the error is at an
// import statement, the path the statement imports.
//
// ParseError.Line and Column come from a count of characters up to the error
// that is then split into lines by their length in bytes (Benthos v4.60.0,
// parser.LineAndColOf): every non-ASCII character on an earlier line moves the
// reported position back by its extra bytes (the "§" in a comment is enough).
// The count is recovered from them and split again by characters.
func locateParseError(content string, perr *bloblang.ParseError) (line, col int, imported string, isImport bool) {
	lines := strings.Split(content, "\n")
	offset := perr.Column - 1
	for i := 0; i < perr.Line-1 && i < len(lines); i++ {
		offset += len(lines[i]) + 1
	}
	runes := []rune(content)
	offset = max(0, min(offset, len(runes)))

	line, col = 1, 1
	for _, r := range runes[:offset] {
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}

	rest := string(runes[offset:])
	after, ok := strings.CutPrefix(rest, "import")
	if !ok {
		return line, col, "", false
	}
	after = strings.TrimLeft(after, " \t")
	if len(after) == len(rest)-len("import") || !strings.HasPrefix(after, `"`) {
		// Not the import keyword (an identifier such as imported_at), or
		// no path.
		return line, col, "", false
	}
	// A quoted string as Bloblang reads it: up to the first quote that is
	// not escaped, then unquoted as Go does.
	escaped := false
	for i := 1; i < len(after); i++ {
		switch {
		case after[i] == '"' && !escaped:
			name, err := strconv.Unquote(after[:i+1])
			if err != nil {
				return line, col, "", false
			}
			return line, col, name, true
		case after[i] == '\\':
			escaped = !escaped
		default:
			escaped = false
		}
	}
	return line, col, "", false
}

// oneLine keeps an error on one line of a log: Bloblang quotes the text it
// did not expect, newlines included.
func oneLine(s string) string {
	if !strings.Contains(s, "\n") {
		return s
	}
	return strings.ReplaceAll(s, "\n", `\n`)
}

// maxQuotedBytes caps a value quoted in a mapping error, as the mappings'
// show helper does (mappings/common.blobl): a message of 16 MiB of digits
// must not give an error of that size, in the outbox row or in the logs.
const maxQuotedBytes = 64

// typeErrorValue matches the value Benthos appends to a type error, which
// ends the error: `expected number value, got string ("...")`. A string is
// put between quotes as it is, unescaped, so quotes inside it would confuse
// the search for quoted strings below.
var typeErrorValue = regexp.MustCompile(`(?s)(got (?:string|number|bool) \()(.*)\)$`)

// capQuoted cuts every value a mapping error quotes to maxQuotedBytes, with a
// note of how much was left out: the value of a Benthos type error, and
// every double-quoted string (strconv's errors quote the whole text they
// could not parse: `strconv.ParseFloat: parsing "1111…": value out of
// range`).
func capQuoted(s string) string {
	if m := typeErrorValue.FindStringSubmatchIndex(s); m != nil && m[5]-m[4] > maxQuotedBytes {
		v := s[m[4]:m[5]]
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
			kept := cutText(v, maxQuotedBytes, false)
			s = s[:m[4]] + fmt.Sprintf(`"%s"... (%d more bytes)`, kept, len(v)-len(kept)) + ")"
		} else {
			kept := cutText(v, maxQuotedBytes, false)
			s = s[:m[4]] + fmt.Sprintf("%s... (%d more bytes)", kept, len(v)-len(kept)) + ")"
		}
	}
	var b strings.Builder
	for {
		open := strings.IndexByte(s, '"')
		if open < 0 {
			break
		}
		end := closingQuote(s, open)
		if end < 0 {
			break
		}
		b.WriteString(s[:open])
		if v := s[open+1 : end]; len(v) > maxQuotedBytes {
			kept := cutText(v, maxQuotedBytes, true)
			fmt.Fprintf(&b, `"%s"... (%d more bytes)`, kept, len(v)-len(kept))
		} else {
			b.WriteString(s[open : end+1])
		}
		s = s[end+1:]
	}
	b.WriteString(s)
	return b.String()
}

// closingQuote returns the index of the quote that closes the one at open,
// skipping backslash escapes; -1 when there is none.
func closingQuote(s string, open int) int {
	for i := open + 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// cutText returns the longest prefix of s of at most n bytes that ends
// between two characters and, when escaped, between two escape sequences
// of a Go-quoted string (\n, \xff, \u00e9, \U0001f600, \"; a byte that is
// not UTF-8 counts as one character).
func cutText(s string, n int, escaped bool) string {
	i := 0
	for i < len(s) {
		size := 1
		switch {
		case escaped && s[i] == '\\' && i+1 < len(s):
			switch s[i+1] {
			case 'x':
				size = 4
			case 'u':
				size = 6
			case 'U':
				size = 10
			case '0', '1', '2', '3', '4', '5', '6', '7':
				size = 4
			default:
				size = 2
			}
		default:
			_, size = utf8.DecodeRuneInString(s[i:])
		}
		if i+size > n {
			break
		}
		i += size
	}
	return s[:i]
}

// structuralPrefix matches the context Bloblang adds around an error raised
// inside a mapping; the reason itself (a throw() message, or a field's type
// error such as "field `this.x`: ...") is what remains.
// An object literal adds "failed to resolve 'key' value: " (Benthos
// query/literals.go); keys are mapping fields, so they hold no quote.
var structuralPrefix = regexp.MustCompile(`^(?:failed assignment \(line \d+\): |failed to process element \d+: |map [\w-]+: |(?:if|match) expression: |failed to resolve '[^']*' value: )`)

// ErrorReason returns the reason of a mapping error without its
// structural prefixes, every quoted value in it cut to maxQuotedBytes and
// the whole to maxReasonBytes.
func ErrorReason(err error) string {
	s := err.Error()
	for {
		loc := structuralPrefix.FindStringIndex(s)
		if loc == nil || loc[1] == len(s) {
			return cutReason(capQuoted(s))
		}
		s = s[loc[1]:]
	}
}

// maxReasonBytes bounds a mapping error as flagged and logged. Bloblang's
// type errors quote the value they got ("expected number value, got string
// (\"...\")"), which can be as long as the message, and the reason ends up in
// the outbox row and the logs.
const maxReasonBytes = 1024

// cutReason cuts s to at most maxReasonBytes (plus a note of how much was
// cut), at a character boundary.
func cutReason(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	end := maxReasonBytes
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return fmt.Sprintf("%s... (%d more bytes)", s[:end], len(s)-end)
}

// LogReason is err in full, as the debug log shows it: Bloblang's
// structural prefixes kept, quoted values and length cut as ErrorReason
// cuts them.
func LogReason(err error) string { return cutReason(capQuoted(err.Error())) }
