package outboxcli

import (
	"io"
	"strings"

	"golang.org/x/text/width"
)

// displayWidth is how many terminal columns s takes: East Asian wide and
// fullwidth characters (a plate's 粤, 京, ...) take two, others one.
// text/tabwriter counts every character as one, so a Chinese plate shifted
// the columns after it.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		switch width.LookupRune(r).Kind() {
		case width.EastAsianWide, width.EastAsianFullwidth:
			n += 2
		default:
			n++
		}
	}
	return n
}

// writeTable writes rows as columns padded to their widest cell by display
// width, gap spaces apart; the last column is not padded.
func writeTable(w io.Writer, rows [][]string, gap int) error {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		for i, cell := range row {
			b.WriteString(cell)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(cell)+gap))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
