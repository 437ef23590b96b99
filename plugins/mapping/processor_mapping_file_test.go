package mapping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"go.uber.org/goleak"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/forwarder/forwarder/internal/mappingfile"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// writeFile replaces path atomically, as editors do.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, failing the test after a generous
// deadline; the deadline is a safety net, not what is being tested.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// capture is a metrics exporter and log handler that remembers what it saw.
type capture struct {
	mu       sync.Mutex
	counters map[string]int64
	logs     []string
}

func newCapture() *capture { return &capture{counters: map[string]int64{}} }

func (c *capture) counter(name string, labels map[string]string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var total int64
	for k, v := range c.counters {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		match := true
		for lk, lv := range labels {
			if !strings.Contains(k, lk+"="+lv+",") {
				match = false
			}
		}
		if match {
			total += v
		}
	}
	return total
}

func (c *capture) logged(substr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.logs {
		if strings.Contains(l, substr) {
			return true
		}
	}
	return false
}

type captureCounter struct {
	c   *capture
	key string
}

func (cc captureCounter) Incr(n int64) {
	cc.c.mu.Lock()
	cc.c.counters[cc.key] += n
	cc.c.mu.Unlock()
}

type noopMetric struct{}

func (noopMetric) Timing(int64) {}
func (noopMetric) Set(int64)    {}

type captureExporter struct{ c *capture }

func (e captureExporter) NewCounterCtor(name string, labelKeys ...string) service.MetricsExporterCounterCtor {
	return func(labelValues ...string) service.MetricsExporterCounter {
		var b strings.Builder
		b.WriteString(name + "{")
		for i, k := range labelKeys {
			b.WriteString(k + "=" + labelValues[i] + ",")
		}
		return captureCounter{c: e.c, key: b.String() + "}"}
	}
}

func (captureExporter) NewTimerCtor(string, ...string) service.MetricsExporterTimerCtor {
	return func(...string) service.MetricsExporterTimer { return noopMetric{} }
}

func (captureExporter) NewGaugeCtor(string, ...string) service.MetricsExporterGaugeCtor {
	return func(...string) service.MetricsExporterGauge { return noopMetric{} }
}

func (captureExporter) Close(context.Context) error { return nil }

type captureHandler struct{ c *capture }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.c.mu.Lock()
	h.c.logs = append(h.c.logs, r.Level.String()+" "+r.Message)
	h.c.mu.Unlock()
	return nil
}
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

type testBundle struct {
	dir     string
	path    string
	capture *capture
	// mapOne sends one message, with metadata key/value pairs, through the
	// stream and returns the mapped message.
	mapOne func(body string, meta ...string) *service.Message
}

// setup runs a stream whose only processor is mapping_file on a fresh file
// holding mapping, reloaded every 10ms.
func setup(t *testing.T, mapping string) *testBundle {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "m.blobl")
	writeFile(t, path, mapping)
	return setupAt(t, dir, path, "10ms")
}

// setupAt runs a stream whose only processor is mapping_file on the
// existing file at path (in dir), reloaded every interval.
func setupAt(t *testing.T, dir, path, interval string) *testBundle {
	t.Helper()
	tb := &testBundle{dir: dir, path: path, capture: newCapture()}

	env := service.NewEnvironment()
	if err := env.RegisterMetricsExporter("capture", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Logger) (service.MetricsExporter, error) {
			return captureExporter{c: tb.capture}, nil
		}); err != nil {
		t.Fatal(err)
	}
	sb := env.NewStreamBuilder()
	sb.SetLogger(slog.New(captureHandler{c: tb.capture}))
	if err := sb.SetMetricsYAML("capture: {}"); err != nil {
		t.Fatal(err)
	}
	produce, err := sb.AddBatchProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.AddProcessorYAML(fmt.Sprintf("mapping_file:\n  path: %q\n  reload_interval: %s\n", tb.path, interval)); err != nil {
		t.Fatal(err)
	}
	out := make(chan *service.Message, 1)
	if err := sb.AddBatchConsumerFunc(func(_ context.Context, b service.MessageBatch) error {
		for _, m := range b {
			out <- m.Copy()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	runDone := make(chan struct{})
	go func() {
		runErr = stream.Run(ctx)
		close(runDone)
	}()
	t.Cleanup(func() {
		stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer stopCancel()
		select {
		case <-runDone:
		default:
			if err := stream.Stop(stopCtx); err != nil {
				t.Errorf("stopping stream: %v", err)
			}
		}
		cancel()
		<-runDone
	})

	tb.mapOne = func(body string, meta ...string) *service.Message {
		t.Helper()
		msg := service.NewMessage([]byte(body))
		for i := 0; i+1 < len(meta); i += 2 {
			msg.MetaSetMut(meta[i], meta[i+1])
		}
		if err := produce(ctx, service.MessageBatch{msg}); err != nil {
			t.Fatalf("producing: %v", err)
		}
		select {
		case m := <-out:
			return m
		case <-runDone:
			t.Fatalf("stream stopped: %v", runErr)
			return nil
		}
	}
	// Processors are built when the stream runs: wait for one message to
	// pass so that the file is loaded before the test changes it.
	tb.mapOne(`{}`)
	return tb
}

func body(t *testing.T, m *service.Message) string {
	t.Helper()
	if err := m.GetError(); err != nil {
		t.Fatalf("unexpected mapping error: %v", err)
	}
	b, err := m.AsBytes()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMappingFile(t *testing.T) {
	t.Parallel()

	t.Run("EditTakesEffectWithoutRestart", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `root.v = "one"`)
		if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one"}` {
			t.Fatalf("before the edit: got %s", got)
		}

		writeFile(t, tb.path, `root.v = "two"`)
		eventually(t, "the edited mapping serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"two"}`
		})
		if got := tb.capture.counter(metricReloads, map[string]string{"result": "success"}); got != 1 {
			t.Errorf("reloads{result=success} = %d, want 1", got)
		}
		if got := tb.capture.counter(metricReloads, map[string]string{"result": "error"}); got != 0 {
			t.Errorf("reloads{result=error} = %d, want 0", got)
		}
		if !tb.capture.logged("Reloaded mapping file " + tb.path) {
			t.Errorf("no reload log line; logs: %v", tb.capture.logs)
		}
	})

	t.Run("BrokenEditKeepsPreviousMapping", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `root.v = "one"`)
		if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one"}` {
			t.Fatalf("before the edit: got %s", got)
		}

		writeFile(t, tb.path, "root.v = \"one\"\nroot.w = this.nope()\n")
		eventually(t, "the broken edit is rejected", func() bool {
			return tb.capture.counter(metricReloads, map[string]string{"result": "error"}) == 1
		})
		if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one"}` {
			t.Fatalf("after the broken edit: got %s, want the previous mapping's output", got)
		}
		if !tb.capture.logged("m.blobl:2:") {
			t.Errorf("the rejection log names no file:line; logs: %v", tb.capture.logs)
		}

		// The broken content is not retried on every poll: one error only.
		writeFile(t, tb.path, `root.v = "three"`)
		eventually(t, "the fixed mapping serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"three"}`
		})
		if got := tb.capture.counter(metricReloads, map[string]string{"result": "error"}); got != 1 {
			t.Errorf("reloads{result=error} = %d, want 1", got)
		}
		if got := tb.capture.counter(metricReloads, map[string]string{"result": "success"}); got != 1 {
			t.Errorf("reloads{result=success} = %d, want 1", got)
		}
	})

	t.Run("RemovedFileKeepsPreviousMapping", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `root.v = "one"`)
		if err := os.Remove(tb.path); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the removal is rejected", func() bool {
			return tb.capture.counter(metricReloads, map[string]string{"result": "error"}) == 1
		})
		if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one"}` {
			t.Fatalf("after removing the file: got %s", got)
		}
		writeFile(t, tb.path, `root.v = "back"`)
		eventually(t, "the restored file serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"back"}`
		})
	})

	t.Run("ImportedFileIsWatched", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `root.v = "placeholder"`)
		lib := filepath.Join(tb.dir, "lib", "common.blobl")
		if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, lib, "map v {\n  root = \"one\"\n}\n")
		// Imports resolve against the importing file's directory.
		writeFile(t, tb.path, "import \"./lib/common.blobl\"\nroot.v = this.apply(\"v\")\n")
		eventually(t, "the importing mapping serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"one"}`
		})

		writeFile(t, lib, "map v {\n  root = \"two\"\n}\n")
		eventually(t, "the edited import serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"two"}`
		})
	})

	t.Run("BrokenImportIsLoggedWithItsFile", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `root.v = "placeholder"`)
		lib := filepath.Join(tb.dir, "common.blobl")
		writeFile(t, lib, "map v {\n  root = \"one\"\n}\n")
		writeFile(t, tb.path, "# Rules (§5)\nimport \"./common.blobl\"\nroot.v = this.apply(\"v\")\n")
		eventually(t, "the importing mapping serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == `{"v":"one"}`
		})

		writeFile(t, lib, "map v {\n  root = \"two\" +\n}\n")
		eventually(t, "the broken import is rejected", func() bool {
			return tb.capture.counter(metricReloads, map[string]string{"result": "error"}) == 1
		})
		if want := lib + ":3:1: "; !tb.capture.logged(want) || !tb.capture.logged("(imported by "+tb.path+":2:1)") {
			t.Errorf("the rejection log does not name %s and its importer; logs: %v", want, tb.capture.logs)
		}
		if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one"}` {
			t.Fatalf("after the broken import: got %s, want the previous mapping's output", got)
		}
	})

	t.Run("ThrownErrorFlagsMessageWithItsReason", func(t *testing.T) {
		t.Parallel()
		tb := setup(t, `
map enter_state {
  root = match {
    this.value == 1 => "1"
    _ => throw("%s %v is not 0 or 1".format(this.field, this.value))
  }
}
map pic {
  root.t = {"field": "pictures[%d].picType".format(this.index), "value": this.value}.apply("enter_state")
}
root.enter_state = {"field": "inoutType", "value": this.inoutType}.apply("enter_state")
root.pictures = this.pictures.enumerated().map_each(p -> p.apply("pic"))
# An error leaving an object literal of the main mapping (mappings/README.md
# advises against it) still records only the thrown reason.
root.extra = {"state": {"field": "extraType", "value": this.extraType.or(1)}.apply("enter_state")}
`)
		for in, want := range map[string]string{
			`{"inoutType":7,"pictures":[]}`:               "inoutType 7 is not 0 or 1",
			`{"inoutType":1,"pictures":[5]}`:              "pictures[0].picType 5 is not 0 or 1",
			`{"inoutType":1,"pictures":{}}`:               "expected array value, got object",
			`{"inoutType":1,"pictures":[],"extraType":3}`: "extraType 3 is not 0 or 1",
		} {
			msg := tb.mapOne(in)
			err := msg.GetError()
			if err == nil {
				t.Errorf("%s: no error flag", in)
				continue
			}
			if strings.Contains(want, "expected array") {
				if !strings.Contains(err.Error(), want) || strings.HasPrefix(err.Error(), "failed assignment") {
					t.Errorf("%s: error %q", in, err)
				}
			} else if err.Error() != want {
				t.Errorf("%s: error %q, want %q", in, err, want)
			}
			// The message is passed on unchanged, metadata included.
			if got, _ := msg.AsBytes(); string(got) != in {
				t.Errorf("%s: errored message content changed to %s", in, got)
			}
		}
	})

	t.Run("MetadataIsKept", func(t *testing.T) {
		t.Parallel()
		// The output reads outbox_id and claim_token after the mapping.
		tb := setup(t, "root.id = @message_key\nroot.n = this.n.number()\n")
		for _, in := range []string{`{"n":1}`, `{"n":"x"}`} {
			msg := tb.mapOne(in, "message_key", "k1", "outbox_id", "42", "claim_token", "tok")
			for k, want := range map[string]string{"message_key": "k1", "outbox_id": "42", "claim_token": "tok"} {
				if got, _ := msg.MetaGet(k); got != want {
					t.Errorf("%s: metadata %s = %q, want %q", in, k, got, want)
				}
			}
			if in == `{"n":1}` {
				if got := body(t, msg); got != `{"id":"k1","n":1}` {
					t.Errorf("got %s", got)
				}
			} else if msg.GetError() == nil {
				t.Errorf("%s: want an error flag", in)
			}
		}
	})

	t.Run("TheClaimSurvivesMetaDeleted", func(t *testing.T) {
		t.Parallel()
		// meta = deleted() keeps metadata out of a request; the claim the
		// output needs to record a result comes back, the rest stays gone.
		tb := setup(t, "root = this\nmeta = deleted()\nmeta note = \"mapped\"\n")
		claimed := tb.mapOne(`{"n":1}`, "outbox_id", "42", "claim_token", "tok", "attempt", "2", "message_key", "k1", "x_custom", "1")
		unclaimed := tb.mapOne(`{"n":1}`, "message_key", "k1", "x_custom", "1")
		for k, want := range map[string]string{"outbox_id": "42", "claim_token": "tok", "attempt": "2", "message_key": "k1", "note": "mapped"} {
			if got, _ := claimed.MetaGet(k); got != want {
				t.Errorf("claimed message: metadata %s = %q, want %q", k, got, want)
			}
		}
		for _, k := range []string{"x_custom", "kafka_topic"} {
			if v, ok := claimed.MetaGet(k); ok {
				t.Errorf("claimed message: metadata %s = %q, want it deleted (not part of the claim, or not set)", k, v)
			}
		}
		for _, k := range []string{"message_key", "x_custom"} {
			if v, ok := unclaimed.MetaGet(k); ok {
				t.Errorf("message without a claim: metadata %s = %q, want it deleted", k, v)
			}
		}
	})
}

// A batch is always mapped by a single version of the mapping, however the
// file changes while batches are processed.
func TestMappingFileSwapIsPerBatch(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	path := filepath.Join(dir, "m.blobl")
	writeFile(t, path, `root.v = "A"`)
	proc, err := newMappingFile(path, time.Millisecond, mappingfile.OSFiles{}, service.MockResources().Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := proc.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})

	stop := make(chan struct{})
	writerDone := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-writerDone
	})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			version := []string{"A", "B"}[i%2]
			tmp := fmt.Sprintf("%s.%d.tmp", path, i)
			if err := os.WriteFile(tmp, []byte(`root.v = "`+version+`"`), 0o644); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()

	batch := make(service.MessageBatch, 200)
	for i := range batch {
		batch[i] = service.NewMessage([]byte(`{}`))
	}
	seen := map[string]int{}
	for seen["A"] < 5 || seen["B"] < 5 {
		out, err := proc.ProcessBatch(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || len(out[0]) != len(batch) {
			t.Fatalf("got %d batches, want one of %d messages", len(out), len(batch))
		}
		first := ""
		for i, m := range out[0] {
			b, err := m.AsBytes()
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = string(b)
			} else if string(b) != first {
				t.Fatalf("message %d mapped as %s, message 0 as %s: a batch mixed two mappings", i, b, first)
			}
		}
		seen[first[len(`{"v":"`):len(`{"v":"`)+1]]++
	}
}

func TestMappingFileConstruction(t *testing.T) {
	t.Parallel()

	t.Run("BrokenFileFailsWithLine", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "broken.blobl")
		writeFile(t, path, "root.a = 1\nroot.b = this.b.no_such_method()\nroot.c = 2\n")
		_, err := newMappingFile(path, 0, mappingfile.OSFiles{}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "broken.blobl:2:") {
			t.Fatalf("got %v, want an error naming broken.blobl:2:", err)
		}
	})

	t.Run("MissingFileFails", func(t *testing.T) {
		t.Parallel()
		_, err := newMappingFile(filepath.Join(t.TempDir(), "nope.blobl"), 0, mappingfile.OSFiles{}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "nope.blobl") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("NegativeIntervalRejected", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "m.blobl")
		writeFile(t, path, `root = this`)
		conf, err := mappingFileSpec().ParseYAML(fmt.Sprintf("path: %q\nreload_interval: -1s\n", path), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newMappingFileFromParsed(conf, service.MockResources()); err == nil || !strings.Contains(err.Error(), "reload_interval") {
			t.Fatalf("got %v", err)
		}
	})
}

// forwarder lint compiles the file a mapping_file processor points at and
// reports its errors with the file's line and column, at the line of the
// path field.
func TestMappingFileLint(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	good := filepath.Join(dir, "good.blobl")
	writeFile(t, good, "root.a = this.a\n")
	broken := filepath.Join(dir, "broken.blobl")
	writeFile(t, broken, "root.a = this.a\n\nroot.b = this.b.no_such_method()\nroot.c = 1\n")

	config := func(path string) string {
		return fmt.Sprintf(`input:
  generate:
    mapping: 'root = {}'
pipeline:
  processors:
    - mapping_file:
        path: %q
output:
  drop: {}
`, path)
	}
	linter := service.GlobalEnvironment().FullConfigSchema("", "").NewStreamConfigLinter()

	lints, err := linter.LintYAML([]byte(config(good)))
	if err != nil {
		t.Fatal(err)
	}
	if len(lints) != 0 {
		t.Fatalf("good mapping: unexpected lints %v", lints)
	}

	lints, err = linter.LintYAML([]byte(config(broken)))
	if err != nil {
		t.Fatal(err)
	}
	if len(lints) != 1 {
		t.Fatalf("broken mapping: got lints %v, want one", lints)
	}
	if lints[0].Line != 7 {
		t.Errorf("lint at line %d, want 7 (the path field): %v", lints[0].Line, lints[0])
	}
	if !strings.Contains(lints[0].What, "broken.blobl:3:") {
		t.Errorf("lint %q does not name broken.blobl:3:", lints[0].What)
	}

	lints, err = linter.LintYAML([]byte(config(filepath.Join(dir, "missing.blobl"))))
	if err != nil {
		t.Fatal(err)
	}
	if len(lints) != 1 || !strings.Contains(lints[0].What, "missing.blobl") {
		t.Fatalf("missing mapping: got lints %v", lints)
	}
}

// A parse error names the file it is in, with the line and column counted in
// characters, also when that file is imported: Bloblang reports an error in
// an import at the import statement, without the imported file's name.
func TestMappingFileParseErrorLocation(t *testing.T) {
	t.Parallel()

	// compileError writes files (name -> content) into a fresh directory and
	// returns that directory and the error of compiling main.blobl there.
	compileError := func(t *testing.T, files map[string]string) (string, string) {
		t.Helper()
		dir := t.TempDir()
		for name, content := range files {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, content)
		}
		_, err := newMappingFile(filepath.Join(dir, "main.blobl"), 0, mappingfile.OSFiles{}, nil, nil)
		if err == nil {
			t.Fatal("compiled, want an error")
		}
		return dir, err.Error()
	}
	wantIn := func(t *testing.T, got string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("error %q does not contain %q", got, w)
			}
		}
	}

	t.Run("ErrorInImportedFile", func(t *testing.T) {
		t.Parallel()
		dir, got := compileError(t, map[string]string{
			// The non-ASCII comments moved Bloblang's positions back.
			"main.blobl":       "# Rules (§5, §11)\nimport \"./lib/common.blobl\"\nroot.v = this.apply(\"v\")\n",
			"lib/common.blobl": "# Shared rules (§5)\nmap v {\n  root = \"one\"\n}\n\nmap w {{\n  root = 1\n}\n",
		})
		wantIn(t, got,
			"compiling "+filepath.Join(dir, "lib", "common.blobl")+":6:8: ",
			"(imported by "+filepath.Join(dir, "main.blobl")+":2:1)")
		if strings.Contains(strings.ReplaceAll(got, "imported by", ""), "impor") || strings.Contains(got, "\n") {
			t.Errorf("error %q still carries the import statement's snippet or a newline", got)
		}
	})

	t.Run("ErrorInNestedImport", func(t *testing.T) {
		t.Parallel()
		dir, got := compileError(t, map[string]string{
			"main.blobl": "import \"./a/a.blobl\"\nroot = this.apply(\"a\")\n",
			"a/a.blobl":  "\n\nimport \"../b/b.blobl\"\nmap a {\n  root = this.apply(\"b\")\n}\n",
			"b/b.blobl":  "map b {\n  root = this.nope(\n}\n",
		})
		wantIn(t, got,
			filepath.Join(dir, "b", "b.blobl")+":3:1: ",
			"(imported by "+filepath.Join(dir, "a", "a.blobl")+":3:1, imported by "+filepath.Join(dir, "main.blobl")+":1:1)")
	})

	t.Run("MissingImport", func(t *testing.T) {
		t.Parallel()
		dir, got := compileError(t, map[string]string{
			"main.blobl": "root.a = 1\nimport \"./nope.blobl\"\n",
		})
		wantIn(t, got, filepath.Join(dir, "main.blobl")+":2:1: failed to read import: ", "nope.blobl")
	})

	t.Run("ImportWithoutMaps", func(t *testing.T) {
		t.Parallel()
		dir, got := compileError(t, map[string]string{
			"main.blobl": "import \"./lib.blobl\"\nroot = 1\n",
			"lib.blobl":  "root = 2\n",
		})
		wantIn(t, got, filepath.Join(dir, "main.blobl")+":1:1: no maps to import from")
	})

	t.Run("ErrorAfterNonASCII", func(t *testing.T) {
		t.Parallel()
		dir, got := compileError(t, map[string]string{
			"main.blobl": "# §§§ — rules\nroot.a = 1\nroot.b = this.b.no_such_method()\n",
		})
		// Bloblang places the error after the call: column 33 of line 3
		// (Bloblang says 3:28: it counts the comment's bytes as characters).
		wantIn(t, got, filepath.Join(dir, "main.blobl")+":3:33: unrecognised method 'no_such_method'")
	})

	// The shipped mappings with a typo in common.blobl: the error names
	// common.blobl at the typo, at start-up, in lint and at a reload.
	t.Run("ShippedCommonBroken", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		for _, name := range []string{"common.blobl", "vehicle_event.blobl", "heartbeat.blobl"} {
			b, err := os.ReadFile(filepath.Join("..", "..", "mappings", name))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, name), string(b))
		}
		common := filepath.Join(dir, "common.blobl")
		line := replaceOnce(t, common, "map text {", "map text {{")
		col := len("map text {{") // the second brace, 1-based
		importLine := lineContaining(t, filepath.Join(dir, "vehicle_event.blobl"), `import "./common.blobl"`)
		want := []string{
			fmt.Sprintf("%s:%d:%d: ", common, line, col),
			fmt.Sprintf("(imported by %s:%d:1)", filepath.Join(dir, "vehicle_event.blobl"), importLine),
		}

		_, err := newMappingFile(filepath.Join(dir, "vehicle_event.blobl"), 0, mappingfile.OSFiles{}, nil, nil)
		if err == nil {
			t.Fatal("compiled, want an error")
		}
		wantIn(t, err.Error(), want...)

		linter := service.GlobalEnvironment().FullConfigSchema("", "").NewStreamConfigLinter()
		lints, err := linter.LintYAML(fmt.Appendf(nil, "input:\n  generate:\n    mapping: 'root = {}'\npipeline:\n  processors:\n    - mapping_file:\n        path: %q\noutput:\n  drop: {}\n", filepath.Join(dir, "vehicle_event.blobl")))
		if err != nil {
			t.Fatal(err)
		}
		if len(lints) != 1 {
			t.Fatalf("got lints %v, want one", lints)
		}
		wantIn(t, lints[0].What, want...)
	})
}

// replaceOnce replaces the only line of file containing old with the line
// where old becomes new, and returns its 1-based number.
func replaceOnce(t *testing.T, file, old, new string) int {
	t.Helper()
	line := lineContaining(t, file, old)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, strings.Replace(string(b), old, new, 1))
	return line
}

// lineContaining returns the 1-based number of the only line of file that
// contains substr.
func lineContaining(t *testing.T, file, substr string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) {
			if found != 0 {
				t.Fatalf("%q occurs on more than one line of %s", substr, file)
			}
			found = i + 1
		}
	}
	if found == 0 {
		t.Fatalf("%q not found in %s", substr, file)
	}
	return found
}

// TestMappingErrorQuotedValuesAreCapped checks that every value a mapping
// error quotes is cut to 64 bytes, as the mappings' show helper cuts
// the values they name, and says how much was left out: strconv's errors
// quote the whole text they could not parse, Benthos's type errors the whole
// value they got, and either can be as long as the message.
func TestMappingErrorQuotedValuesAreCapped(t *testing.T) {
	t.Parallel()

	digits := strings.Repeat("1", 2000) + "e999"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"Strconv", `strconv.ParseFloat: parsing "` + digits + `": value out of range`,
			`strconv.ParseFloat: parsing "` + digits[:64] + `"... (1940 more bytes): value out of range`},
		{"TypeErrorString", "field `this.x`: expected number value, got string (\"" + strings.Repeat(`a"b`, 400) + "\")",
			"field `this.x`: expected number value, got string (\"" + strings.Repeat(`a"b`, 21) + `a"... (1136 more bytes))`},
		{"TypeErrorNumber", "field `this.x`: expected string value, got number (" + strings.Repeat("7", 1500) + ")",
			"field `this.x`: expected string value, got number (" + strings.Repeat("7", 64) + "... (1436 more bytes))"},
		{"TwoQuotedValues", `"` + strings.Repeat("x", 100) + `" and "` + strings.Repeat("y", 65) + `"`,
			`"` + strings.Repeat("x", 64) + `"... (36 more bytes) and "` + strings.Repeat("y", 64) + `"... (1 more bytes)`},
		{"CharactersAreNotSplit", `parsing "` + strings.Repeat("é", 100) + `"`, `parsing "` + strings.Repeat("é", 32) + `"... (136 more bytes)`},
		{"EscapesAreNotSplit", `parsing "` + strings.Repeat("a", 62) + `\u00e9` + strings.Repeat("a", 10) + `"`,
			`parsing "` + strings.Repeat("a", 62) + `"... (16 more bytes)`},
		{"ShortValuesAreKept", `inoutType "1111" is not 0 or 1; parsing "x\"y": invalid syntax`, `inoutType "1111" is not 0 or 1; parsing "x\"y": invalid syntax`},
		{"AnUnclosedQuoteIsKept", `picUrl "` + strings.Repeat("z", 100), `picUrl "` + strings.Repeat("z", 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := mappingfile.ErrorReason(errors.New("failed assignment (line 1): " + tc.in)); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}

	// Through the processor: a value of 2 KiB that number() cannot parse,
	// and one that abs() cannot take.
	path := filepath.Join(t.TempDir(), "m.blobl")
	writeFile(t, path, "root.n = this.s.number()\nroot.m = this.m.abs()\n")
	p, err := newMappingFile(path, 0, mappingfile.OSFiles{}, service.MockResources().Logger(), service.MockResources().Metrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	for _, tc := range []struct{ body, want string }{
		{`{"s":"` + digits + `","m":1}`, `strconv.ParseFloat: parsing "` + digits[:64] + `"... (1940 more bytes): value out of range`},
		{`{"s":"1","m":"` + strings.Repeat("m", 2048) + `"}`, `got string ("` + strings.Repeat("m", 64) + `"... (1984 more bytes))`},
	} {
		out, err := p.ProcessBatch(context.Background(), service.MessageBatch{service.NewMessage([]byte(tc.body))})
		if err != nil {
			t.Fatal(err)
		}
		reason := fmt.Sprint(out[0][0].GetError())
		if !strings.HasSuffix(reason, tc.want) || len(reason) > 200 {
			t.Errorf("flagged with %d bytes: %.300q; want at most 200 ending in %q", len(reason), reason, tc.want)
		}
	}
}
