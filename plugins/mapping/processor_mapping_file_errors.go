package mapping

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

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
func describeParseError(files fileReader, root, path, content string, perr *bloblang.ParseError) string {
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
