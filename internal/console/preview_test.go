package console_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/bloblang"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// release is closed to end the console_test_wait() calls started since it
// was set: each run of a test sets its own (go test -count N runs it again).
var release atomic.Pointer[chan struct{}]

// newRelease sets a new release channel and returns it, for the caller to
// close.
func newRelease() chan struct{} {
	ch := make(chan struct{})
	release.Store(&ch)
	return ch
}

// A mapping that cannot be stopped once it runs: console_test_wait()
// returns only when the test closes the release channel set before it
// started; console_test_panic() panics.
func init() {
	bloblang.MustRegisterFunctionV2("console_test_wait", bloblang.NewPluginSpec(), func(*bloblang.ParsedParams) (bloblang.Function, error) {
		return func() (any, error) { <-*release.Load(); return "released", nil }, nil
	})
	bloblang.MustRegisterFunctionV2("console_test_panic", bloblang.NewPluginSpec(), func(*bloblang.ParsedParams) (bloblang.Function, error) {
		return func() (any, error) { panic("boom") }, nil
	})
}

// mappingsDir writes vehicle_event.blobl holding mapping into a new
// directory.
func mappingsDir(t *testing.T, mapping string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vehicle_event.blobl"), []byte(mapping), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPreviewBounds: the request preview runs the mapping on at most
// PreviewMaxPayload bytes, shows at most PayloadLimit bytes of what it
// makes, gives up after PreviewTimeout on a mapping that does not finish,
// runs at most two at once, and survives a panicking mapping
// (docs/guarantees.md, "bounded rendering"). Not parallel: the preview
// slots are shared by the process.
func TestPreviewBounds(t *testing.T) {
	rec := outboxdb.Record{ID: 7, MessageKey: "m-1", APIType: "VEHICLE_EVENT", Payload: []byte(vehicle)}

	t.Run("LargePayloadIsNotMapped", func(t *testing.T) {
		big := rec
		big.Payload = []byte(`{"pad":"` + strings.Repeat("x", console.PreviewMaxPayload) + `"}`)
		p := console.PreviewRequest(mappingsDir(t, "root = console_test_panic()"), big)
		if p.Err != "the payload (1.0 MiB) is larger than the 1.0 MiB a preview runs the mapping on: not run" || p.Body != "" {
			t.Errorf("preview of %d bytes: %+v", len(big.Payload), p)
		}
	})

	t.Run("LargeResultIsCut", func(t *testing.T) {
		p := console.PreviewRequest(mappingsDir(t, `root = {"ids": range(0, 100000)}`), rec)
		if p.Err != "" || len(p.Body) > console.PayloadLimit || p.JSON != nil ||
			!strings.HasPrefix(p.Body, "{\n  \"access_name\": \"***\",\n  \"access_pwd\": \"***\",\n  \"ids\": [\n    0,\n") ||
			len(p.Notes) != 1 || !strings.HasPrefix(p.Notes[0], "… ") {
			t.Errorf("preview of a large result: %d bytes of body, JSON %v, notes %q, error %q", len(p.Body), p.JSON != nil, p.Notes, p.Err)
		}
		p = console.PreviewRequest("../../mappings", rec)
		if p.Err != "" || len(p.Notes) != 0 || !strings.Contains(string(p.JSON), `"plate_no":"粤B12345"`) {
			t.Errorf("preview of the shipped mapping: %+v", p)
		}
	})

	t.Run("APanicIsAnError", func(t *testing.T) {
		if p := console.PreviewRequest(mappingsDir(t, "root = console_test_panic()"), rec); p.Err != "the mapping panicked: boom" {
			t.Errorf("preview of a panicking mapping: %+v", p)
		}
	})

	t.Run("AMappingThatDoesNotFinish", func(t *testing.T) {
		dir := mappingsDir(t, "root = {\"x\": console_test_wait()}")
		release := newRelease()
		// Two runs take both slots and outlive their deadline.
		var wg sync.WaitGroup
		errs := make([]string, 2)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = console.PreviewRequest(dir, rec).Err
			}()
		}
		wg.Wait()
		gaveUp := fmt.Sprintf("the mapping did not finish within %v: not shown", console.PreviewTimeout)
		if errs[0] != gaveUp || errs[1] != gaveUp {
			t.Fatalf("previews of a mapping that does not finish: %q, want %q", errs, gaveUp)
		}
		// They still run: a third preview, of any mapping, waits for a
		// slot and gives up.
		if p := console.PreviewRequest("../../mappings", rec); p.Err != "other previews are still running: try again in a moment" {
			t.Errorf("a preview while both slots are taken: %+v", p)
		}
		close(release)
		// Once they end, previews work again (the first may still be
		// freeing its slot: PreviewRequest waits for it).
		if p := console.PreviewRequest(dir, rec); p.Err != "" || !strings.Contains(p.Body, `"x": "released"`) {
			t.Errorf("a preview after the runs ended: %+v", p)
		}
	})
}

// TestPreviewSaysWhatServes: when the mapping file on disk does not
// compile, the preview does not show only the compile error (as if that
// were what the service does): it says that the file on disk is rejected,
// where (file, line and column) and why, and that a running service keeps
// serving the last version that compiled.
func TestPreviewSaysWhatServes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	line := 0
	for _, f := range []string{"vehicle_event.blobl", "common.blobl"} {
		b, err := os.ReadFile(filepath.Join("../../mappings", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "vehicle_event.blobl" {
			// A broken edit: an operator where a value belongs.
			b = []byte(strings.Replace(string(b), "root.park_code = ", "root.park_code = +++ ", 1))
			line = 1 + strings.Count(string(b[:strings.Index(string(b), "+++")]), "\n")
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := console.PreviewRequest(dir, outboxdb.Record{APIType: "VEHICLE_EVENT", MessageKey: "m-1", Payload: []byte(vehicle)})
	file := filepath.Join(dir, "vehicle_event.blobl")
	for _, want := range []string{
		"the file on disk (" + file + ", modified ",
		") does not compile: compiling " + file + ":",
		"A running service rejects such an edit and keeps serving the last version of " + file + " that compiled",
		`"Rejected the edit of mapping file ` + file + `"`,
	} {
		if !strings.Contains(p.Err, want) {
			t.Errorf("preview error lacks %q:\n%s", want, p.Err)
		}
	}
	// Line and column of the mistake, as lint gives them.
	if !regexp.MustCompile(regexp.QuoteMeta(file) + `:` + strconv.Itoa(line) + `:\d+: expected query`).MatchString(p.Err) {
		t.Errorf("the compile error has no line and column: %s", p.Err)
	}
	if p.Body != "" {
		t.Errorf("a body from a mapping that does not compile: %s", p.Body)
	}
}

// TestPreviewOfUnreadablePayload: a payload the mapping cannot read (empty,
// not JSON) shows the row's reason, not Bloblang's words about it.
func TestPreviewOfUnreadablePayload(t *testing.T) {
	t.Parallel()
	reason := "payload is empty"
	for _, c := range []struct {
		payload string
		reason  *string
		want    string
	}{
		{"", &reason, "no request: the mapping cannot read this payload (the row's reason: payload is empty)"},
		{"", nil, "no request: the mapping cannot read this payload (the payload is empty)"},
		{"not json", nil, "no request: the mapping cannot read this payload (the payload is not valid JSON)"},
	} {
		p := console.PreviewRequest("../../mappings", outboxdb.Record{APIType: "VEHICLE_EVENT", Payload: []byte(c.payload), LastError: c.reason})
		if p.Err != c.want || strings.Contains(p.Err, "unable to reference") {
			t.Errorf("payload %q: preview %q, want %q", c.payload, p.Err, c.want)
		}
	}
}

// TestPreviewNamesNoFileOutsideTheMappings: the mapping file is named after
// the row's api_type; one that is not a plain name (written to the table
// directly: ingest stores two) runs nothing, not a .blobl file elsewhere.
func TestPreviewNamesNoFileOutsideTheMappings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mappings := filepath.Join(dir, "mappings")
	if err := os.Mkdir(mappings, 0o755); err != nil {
		t.Fatal(err)
	}
	// A mapping outside the directory that would run if it were named.
	if err := os.WriteFile(filepath.Join(dir, "outside.blobl"), []byte(`root = "ran outside"`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, apiType := range []string{"../outside", "..", "a/../../outside", `..\outside`, "/etc/outside", ""} {
		p := console.PreviewRequest(mappings, outboxdb.Record{APIType: apiType, Payload: []byte(`{}`)})
		if p.Body != "" || !strings.Contains(p.Err, "not a mapping name: not run") {
			t.Errorf("api_type %q: preview %q (err %q), want no run", apiType, p.Body, p.Err)
		}
	}
}
