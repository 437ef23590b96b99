package console_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/hostilejson"
)

// TestRecordPageHostileRows: the row page renders a payload nested 2 000
// deep and one of 4 MiB that indents to 132 MB within bounded memory and
// output, and says what it left out (docs/guarantees.md, "bounded
// rendering"); such rows are FAILED and listed on the Failed page, exactly
// the ones operators open. Rendering the page used to indent the whole
// payload before cutting it: over a gigabyte for the first one. Not parallel: it measures the
// process's allocations.
func TestRecordPageHostileRows(t *testing.T) {
	b := setup(t)
	c := b.start(t, console.Config{})
	for _, row := range []struct {
		key     string
		payload []byte
		want    []string
	}{
		{"deep", hostilejson.Deep(2000, 40), []string{"Nesting deeper than 32 levels not shown ({…}, […]).", "{…}",
			`<p class="error" id="preview-error">mapping: `}},
		{"wide", hostilejson.Wide(4<<20, 30), []string{"… 4.0 MiB more not shown (the first 8.1 KiB of 4.0 MiB are).",
			"the payload (4.0 MiB) is larger than the 1.0 MiB a preview runs the mapping on: not run"}},
	} {
		t.Run(row.key, func(t *testing.T) {
			id := fixture.New(t, b.pool).Insert(fixture.Row{Key: row.key, Status: "FAILED", Payload: row.payload})[0]
			var page string
			n := allocated(func() { page = c.get(fmt.Sprintf("/records/%d", id)) })
			// The row is read whole: a small multiple of its size, plus
			// the request's own (the mapping's compilation and its run).
			if limit := uint64(8*len(row.payload) + 32<<20); n > limit {
				t.Errorf("the page of %s allocated %d MiB, want at most %d MiB", row.key, n>>20, limit>>20)
			}
			if len(page) > 2*console.PayloadLimit {
				t.Errorf("the page of %s is %d bytes, want at most %d", row.key, len(page), 2*console.PayloadLimit)
			}
			for _, w := range row.want {
				if !strings.Contains(page, w) {
					t.Errorf("the page of %s lacks %q", row.key, w)
				}
			}
			t.Logf("%s: %d MiB allocated, a page of %d bytes", row.key, n>>20, len(page))
		})
	}
}
