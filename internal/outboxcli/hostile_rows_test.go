package outboxcli_test

import (
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/hostilejson"
)

// allocated is how many bytes f allocates (the process's, so the tests
// that call it do not run in parallel).
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestShowHostileRows: `outbox show` renders a payload nested 2 000 deep
// and one of 4 MiB that indents to 132 MB within bounded memory and
// output, in text and in --json, and says what it left out
// (docs/guarantees.md, "bounded rendering"). The bound below grows with
// the row's size, not with what it indents to: indenting the payload first
// allocated over a gigabyte for the first one. Not parallel: it measures
// the process's allocations.
func TestShowHostileRows(t *testing.T) {
	b := setup(t)
	db := fixture.New(t, b.pool)
	deep, wide := hostilejson.Deep(2000, 40), hostilejson.Wide(4<<20, 30)
	ids := db.Insert(fixture.Row{Key: "deep", Status: "FAILED", Payload: deep}, fixture.Row{Key: "wide", Status: "FAILED", Payload: wide})

	for _, c := range []struct {
		name    string
		args    []string
		payload []byte
		want    []string
	}{
		{"DeepText", []string{"show", "--mappings", "../../mappings", "deep"}, deep, []string{
			"payload (244004 bytes, JSON, indented):\n{\n  \"n\": {\n",
			"{…}", "Nesting deeper than 32 levels not shown ({…}, […]). (--json has every byte, as payload_base64)",
			"request body (../../mappings/vehicle_event.blobl): none: mapping:",
		}},
		{"WideText", []string{"show", "--mappings", "../../mappings", "wide"}, wide, []string{
			"payload (4194303 bytes, JSON, indented):\n[\n  [\n",
			"… 4.0 MiB more not shown (the first 8.1 KiB of 4.0 MiB are). (--json has every byte, as payload_base64)",
			"request body (../../mappings/vehicle_event.blobl): none: the payload (4.0 MiB) is larger than the 1.0 MiB a preview runs the mapping on: not run",
		}},
		{"DeepJSON", []string{"show", "--json", "--mappings", "../../mappings", strconv.FormatInt(ids[0], 10)}, deep, []string{
			`"payload_omitted": "payload_base64 holds it; as JSON it is too large to show: Nesting deeper than 32 levels not shown`,
		}},
		{"WideJSON", []string{"show", "--json", "--mappings", "../../mappings", "wide"}, wide, []string{
			`"payload_omitted": "payload_base64 holds it; as JSON it is too large to show: … 4.0 MiB more not shown`,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Measured writing to a writer that keeps nothing.
			var printed counter
			var err error
			n := allocated(func() { err = b.runTo(t, &printed, c.args...) })
			if err != nil {
				t.Fatalf("outbox %v: %v", c.args, err)
			}
			// The row is read whole and, with --json, printed whole as
			// base64 through encoding/json's buffers: a small multiple of
			// its size, plus the command's own (the pool, the mapping's
			// compilation and its run on the payload) of about 10 MiB.
			if limit := uint64(12*len(c.payload) + 28<<20); n > limit {
				t.Errorf("outbox %v allocated %d MiB, want at most %d MiB", c.args, n>>20, limit>>20)
			}
			if strings.HasSuffix(c.name, "Text") && printed > 2*console.PayloadLimit {
				t.Errorf("outbox %v printed %d bytes, want at most %d", c.args, printed, 2*console.PayloadLimit)
			}
			out, err := b.run(t, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("outbox %v: output lacks %q:\n%.3000s", c.args, w, out)
				}
			}
			if strings.HasSuffix(c.name, "JSON") {
				var v struct {
					PayloadBase64 []byte          `json:"payload_base64"`
					Payload       json.RawMessage `json:"payload"`
				}
				if err := json.Unmarshal([]byte(out), &v); err != nil || string(v.PayloadBase64) != string(c.payload) || v.Payload != nil {
					t.Errorf("--json: %v; payload_base64 exact: %v, payload left out: %v", err, string(v.PayloadBase64) == string(c.payload), v.Payload == nil)
				}
			}
			t.Logf("outbox %v: %d MiB allocated, %d bytes printed", c.args, n>>20, printed)
		})
	}
}

// counter is an io.Writer that counts what it is given.
type counter int

func (c *counter) Write(p []byte) (int, error) {
	*c += counter(len(p))
	return len(p), nil
}
