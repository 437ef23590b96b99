// Package hostilejson makes the payloads the rendering tests open: valid
// JSON that is small but deeply nested, or a few MiB that indent to
// hundreds (docs/guarantees.md, "bounded rendering").
package hostilejson

import (
	"bytes"
	"strconv"
)

// Deep is a JSON object nested levels deep, with width numbers at every
// level: {"n":{"n":…,"v":[0,1,…]},"v":[0,1,…]}. 2 000 levels of 40
// numbers are 244 KB and indent (two spaces a level) to 177 MB.
func Deep(levels, width int) []byte {
	var b bytes.Buffer
	for range levels {
		b.WriteString(`{"n":`)
	}
	b.WriteString("null")
	numbers := numbers(width)
	for range levels {
		b.WriteString(`,"v":`)
		b.Write(numbers)
		b.WriteByte('}')
	}
	return b.Bytes()
}

// Wide is about size bytes of JSON: an array of zeros nested depth levels
// deep, [[[…[0,0,0,…]…]]]. Every zero indents to a line of its own, 2 ×
// depth spaces long: 4 MiB at depth 30 indent to 132 MB.
func Wide(size, depth int) []byte {
	var b bytes.Buffer
	b.Grow(size)
	for range depth {
		b.WriteByte('[')
	}
	b.WriteByte('0')
	for b.Len() < size-depth-2 {
		b.WriteString(",0")
	}
	for range depth {
		b.WriteByte(']')
	}
	return b.Bytes()
}

func numbers(n int) []byte {
	b := []byte{'['}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
	}
	return append(b, ']')
}
