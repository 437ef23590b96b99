package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/mappingfile"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Payload is a stored payload made fit to show: valid JSON indented, text
// as it is, anything else escaped, and in every case no byte that a
// terminal or a browser would act on (control characters, invalid UTF-8).
// It is bounded whatever the payload (docs/guarantees.md, "bounded
// rendering"): at most the limit given, nesting to MaxDepth.
type Payload struct {
	// Kind is "json", "text", "binary" (not valid UTF-8) or "empty".
	Kind string
	// Text is the payload to show (see SafeText).
	Text string
	// Size is the payload's length in bytes.
	Size int
	// Shown is how many of its bytes Text covers (Size unless cut).
	Shown int
	// BadOffset is the offset of the first byte that is not UTF-8, for
	// binary payloads.
	BadOffset int
	// Collapsed says objects or arrays nested deeper than MaxDepth are
	// shown as {…} / […].
	Collapsed bool
}

// Cut says whether the payload was cut to the display limit.
func (p Payload) Cut() bool { return p.Shown < p.Size }

// Notes say what Text leaves out, one sentence each; none when it shows
// the whole payload.
func (p Payload) Notes() []string {
	var notes []string
	if p.Collapsed {
		notes = append(notes, fmt.Sprintf("Nesting deeper than %d levels not shown ({…}, […]).", MaxDepth))
	}
	if p.Cut() {
		notes = append(notes, fmt.Sprintf("… %s more not shown (the first %s of %s are).",
			sizeText(p.Size-p.Shown), sizeText(p.Shown), sizeText(p.Size)))
	}
	return notes
}

// RenderPayload prepares b for display, showing at most limit bytes of it
// (PayloadLimit when limit <= 0): JSON is indented as it is read, so
// neither its size nor its nesting can make the rendering larger than that.
func RenderPayload(b []byte, limit int) Payload {
	if limit <= 0 {
		limit = PayloadLimit
	}
	p := Payload{Size: len(b), Shown: len(b)}
	if len(b) == 0 {
		p.Kind = "empty"
		return p
	}
	// Backslashes are doubled when anything shown is escaped (SafeText);
	// what is shown lies within the first limit bytes.
	head := b[:min(len(b), limit)]
	var text []byte
	switch {
	case !utf8.Valid(b):
		p.Kind = "binary"
		p.BadOffset = firstInvalid(b)
		text, p.Shown = appendSafe(make([]byte, 0, min(limit, 4*len(b))), b, limit, true)
	// json.Valid walks b once and refuses nesting past 10 000 levels.
	case json.Valid(b):
		p.Kind = "json"
		text, p.Shown, p.Collapsed = indentJSON(b, limit, MaxDepth, !isClean(head, true))
	default:
		p.Kind = "text"
		text, p.Shown = appendSafe(make([]byte, 0, min(limit, 2*len(b))), b, limit, !isClean(head, false))
	}
	p.Text = string(text)
	return p
}

func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// SafeText returns s with everything a terminal or a browser could act on,
// or that could not be shown, written as an escape: bytes that are not
// UTF-8 as \xNN, control and format characters (escape sequences,
// right-to-left overrides) and other unprintable runes as \u{NNNN}, and a
// backslash as \\ when anything was escaped, so the result reads back
// unambiguously. Newlines and tabs are kept. Printable text, Chinese
// included, is unchanged.
func SafeText(s string) string {
	for _, r := range s {
		if !printable(r) {
			out, _ := appendSafe(make([]byte, 0, len(s)+len(s)/4+16), []byte(s), math.MaxInt, true)
			return string(out)
		}
	}
	return s
}

// SafeLine is SafeText for one line of a table or a label: newlines, tabs
// and carriage returns are escaped too (\n, \t, \r), so a value cannot
// break the layout it is printed in.
func SafeLine(s string) string {
	s = SafeText(s)
	if !strings.ContainsAny(s, "\n\t\r") {
		return s
	}
	return strings.NewReplacer("\n", `\n`, "\t", `\t`, "\r", `\r`).Replace(s)
}

// SafeBytes is SafeText for a byte string (a Kafka key).
func SafeBytes(b []byte) string { return SafeText(string(b)) }

// payloadProblem is why a payload cannot be mapped: the row's own reason
// when it has one (set at ingest: empty, not UTF-8, not JSON), else what is
// wrong with it.
func payloadProblem(rec outboxdb.Record) string {
	if rec.LastError != nil && *rec.LastError != "" {
		return "the row's reason: " + SafeText(*rec.LastError)
	}
	if len(rec.Payload) == 0 {
		return "the payload is empty"
	}
	return "the payload is not valid JSON"
}

// rejectedOnDisk says that the mapping file does not compile, and what that
// means for a running service. This process cannot see which version a
// service serves: a service compiles every edit before it swaps it in and
// keeps the last version that compiled (mapping_file, docs/configuration.md
// "Field mappings"), so the file on disk is rejected there too.
func rejectedOnDisk(file string, err error) string {
	when := ""
	if st, serr := os.Stat(file); serr == nil {
		when = ", modified " + st.ModTime().UTC().Format("2006-01-02 15:04:05Z")
	}
	return fmt.Sprintf("the file on disk (%s%s) does not compile: %s. A running service rejects such an edit and keeps "+
		"serving the last version of %s that compiled (its log says \"Rejected the edit of mapping file %s\"; a service "+
		"starting now would refuse to start), so no preview can be made until the file is fixed", file, when, SafeText(err.Error()), file, file)
}

// MaskedCredentials open the previewed body where the output adds the real
// ones at send time.
const MaskedCredentials = `"access_name":"***","access_pwd":"***"`

// Preview is the request body the current mapping would send for a row.
type Preview struct {
	// Mapping is the Bloblang file that was run.
	Mapping string
	// Body is the indented JSON body with the credentials masked, empty
	// when Err is set; bounded like a payload (Notes says what was cut).
	Body string
	// JSON is the body as the mapping made it, credentials masked, for
	// `outbox show --json`; nil when Body is cut.
	JSON []byte
	// Notes say what Body leaves out, as Payload.Notes does.
	Notes []string
	// Err says why there is no body: the mapping's error as the pipeline
	// would record it ("mapping: inoutType 7 is not 0 or 1"), or why the
	// mapping could not be run.
	Err string
}

// Preview bounds (docs/guarantees.md, "bounded rendering"). A Bloblang
// mapping cannot be stopped once it runs, so the input it gets is capped
// (the shipped mappings take milliseconds on it), each run has a deadline
// after which the preview gives up, and only previewRuns may be in progress
// at once: a run that outlives its deadline keeps its slot until it ends.
const (
	// PreviewMaxPayload is the largest payload the mapping is run on.
	PreviewMaxPayload = 1 << 20
	// PreviewTimeout bounds the wait for one preview.
	PreviewTimeout = 2 * time.Second
	previewRuns    = 2
)

var previewSlots = make(chan struct{}, previewRuns)

// PreviewRequest runs the mapping for the row's api_type, read now from
// mappingsDir (<api_type in lower case>.blobl, as pipelines/forwarder.yaml
// names them), on the stored payload with the metadata the dispatcher gives
// it, and returns the body with the credentials masked. Nothing is sent and
// the credentials are never read: the body shows "***" where the
// http_forwarder output puts them. Times follow PLATFORM_TZ of this process.
// The mapping is compiled once per content of its files
// (mappingfile.CompileFile), and run within the bounds above.
func PreviewRequest(mappingsDir string, rec outboxdb.Record) Preview {
	name := strings.ToLower(rec.APIType) + ".blobl"
	file := filepath.Join(mappingsDir, name)
	p := Preview{Mapping: file}
	if rec.APIType == "" || strings.ContainsFunc(rec.APIType, func(c rune) bool {
		return !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-')
	}) {
		// Ingest stores two api_types, both plain names; anything else was
		// written to the table directly, and names no file elsewhere.
		p.Mapping = mappingsDir
		p.Err = fmt.Sprintf("api_type %s is not a mapping name: not run", SafeText(rec.APIType))
		return p
	}
	if len(rec.Payload) > PreviewMaxPayload {
		p.Err = fmt.Sprintf("the payload (%s) is larger than the %s a preview runs the mapping on: not run",
			sizeText(len(rec.Payload)), sizeText(PreviewMaxPayload))
		return p
	}
	if len(rec.Payload) == 0 || !json.Valid(rec.Payload) {
		// The mapping cannot read it at all: its error would only say so
		// in Bloblang's words, where the row already has the reason.
		p.Err = "no request: the mapping cannot read this payload (" + payloadProblem(rec) + ")"
		return p
	}
	exec, err := mappingfile.CompileFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			p.Err = fmt.Sprintf("api_type %s has no mapping: %s does not exist (set --mappings to the mappings directory)", SafeText(rec.APIType), file)
		} else {
			p.Err = rejectedOnDisk(file, err)
		}
		return p
	}
	msg := service.NewMessage(rec.Payload)
	msg.MetaSetMut("message_key", rec.MessageKey)
	msg.MetaSetMut("api_type", rec.APIType)
	msg.MetaSetMut("outbox_id", strconv.FormatInt(rec.ID, 10))
	body, errText := runPreview(exec, msg, PreviewTimeout)
	if errText != "" {
		p.Err = errText
		return p
	}
	body = bytes.TrimSpace(body)
	if len(body) < 2 || body[0] != '{' {
		p.Err = "the mapping's result is not a JSON object: " + SafeText(string(body[:min(len(body), 512)]))
		return p
	}
	masked := []byte("{" + MaskedCredentials)
	if rest := bytes.TrimSpace(body[1:]); len(rest) > 0 && rest[0] != '}' {
		masked = append(masked, ',')
	}
	masked = append(masked, body[1:]...)
	if !json.Valid(masked) {
		p.Err = "the mapping's result is not valid JSON"
		return p
	}
	shown := RenderPayload(masked, PayloadLimit)
	p.Body, p.Notes = shown.Text, shown.Notes()
	if len(p.Notes) == 0 {
		p.JSON = masked
	}
	return p
}

// runPreview runs exec on msg and returns the body, or why there is none,
// giving up after timeout (waiting for a free slot included).
func runPreview(exec *bloblang.Executor, msg *service.Message, timeout time.Duration) ([]byte, string) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	gaveUp := fmt.Sprintf("the mapping did not finish within %v: not shown", timeout)
	select {
	case previewSlots <- struct{}{}:
	case <-deadline.C:
		return nil, "other previews are still running: try again in a moment"
	}
	type result struct {
		body []byte
		err  string
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-previewSlots }()
		defer func() {
			// The handler no longer recovers it for us: a panic in a
			// mapping function must not take the console down.
			if v := recover(); v != nil {
				done <- result{err: SafeText(fmt.Sprintf("the mapping panicked: %v", v))}
			}
		}()
		res, err := msg.BloblangQuery(exec)
		switch {
		case err != nil:
			done <- result{err: "mapping: " + SafeText(mappingfile.ErrorReason(err))}
		case res == nil:
			done <- result{err: "the mapping deleted the message: nothing would be sent"}
		default:
			b, err := res.AsBytes()
			if err != nil {
				done <- result{err: SafeText(err.Error())}
				return
			}
			done <- result{body: b}
		}
	}()
	select {
	case r := <-done:
		return r.body, r.err
	case <-deadline.C:
		return nil, gaveUp
	}
}
