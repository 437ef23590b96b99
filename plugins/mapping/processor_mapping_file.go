// Package mapping provides the mapping_file processor, which runs a Bloblang
// mapping kept in a file and reloads it when the file changes, and the
// Bloblang helpers the shipped mappings use (percent_round, ts_format_platform).
package mapping

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	// Event times are formatted in PLATFORM_TZ: embed the zone database so a
	// host or container without /usr/share/zoneinfo still knows Asia/Shanghai.
	_ "time/tzdata"
)

const (
	mfFieldPath           = "path"
	mfFieldReloadInterval = "reload_interval"

	// metricReloads counts reloads after start by result: success or error.
	metricReloads = "forwarder_mapping_reloads_total"

	// lintFunctionName is the Bloblang function behind the path field's lint
	// rule, so that `forwarder lint` compiles the referenced file.
	lintFunctionName = "mapping_file_lint"
)

func mappingFileSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Mapping").
		Summary("Executes a Bloblang mapping read from a file, and reloads it without a restart when the file changes.").
		Description(`
Works like the `+"`mapping`"+` processor (the result replaces the message, metadata is kept, a failing mapping leaves the message unchanged and flags it with the error) except that the mapping lives in a file which is watched while the stream runs.

Every `+"`reload_interval`"+` the processor checks the file and every file it imports (modification time and size, then content). When the content changed and stays the same for a short settle period, the new mapping is compiled and swapped in atomically. An edit that does not compile, or a file that disappears, is rejected: the error is logged with the file it is in (the imported file, when the mistake is in an import), its line and its column, the counter `+"`forwarder_mapping_reloads_total{result=\"error\"}`"+` goes up, and the previous mapping keeps serving until a later edit compiles. Each batch is mapped by one compiled mapping, taken once per batch, so no message is ever mapped half by the old and half by the new version. Prefer saving with an atomic rename (most editors do); a file written in place is still only read once it has settled.

The path, and the paths of `+"`import`"+` statements inside the file, follow Bloblang's rules: a relative path is resolved against the process's working directory (not the config file's directory), and an import is resolved against the directory of the file that contains it. `+"`forwarder lint`"+` compiles the file too, from the working directory it runs in.

A mapping file cannot read the host: it is compiled without Bloblang's functions that read the environment, files or the host (`+"`env`"+`, `+"`file`"+`, `+"`file_rel`"+`, `+"`hostname`"+`, and any other function or method Benthos marks impure, but for `+"`ts_format_platform`"+`, which reads `+"`PLATFORM_TZ`"+` only), and an `+"`import`"+` of a file outside the directory of the mapping file (or its subdirectories) is refused. Either is a compile error that says so, at start-up, in `+"`forwarder lint`"+` and on reload. The error a mapping raises ends up in the outbox row, the logs and the console, so a mapping that could call `+"`env(\"DATABASE_URL\")`"+` could put a secret there.

When the mapping fails for a message, the flag carries the reason without Bloblang's structural prefixes (`+"`failed assignment (line N): `"+`, `+"`failed to process element N: `"+`, ...), so `+"`throw(\"inoutType 7 is not 0 or 1\")`"+` flags the message with exactly `+"`inoutType 7 is not 0 or 1`"+`; the full error is logged at debug level. Every value the reason quotes (the value a type error got, the text `+"`strconv`"+` could not parse) is cut to 64 bytes, and the whole reason to 1 KiB, each with a note of how many bytes were left out.

== Metrics

- `+"`forwarder_mapping_reloads_total`"+` (counter, label `+"`result`"+`: `+"`success`"+` or `+"`error`"+`): reloads attempted after start.`).
		Fields(
			service.NewStringField(mfFieldPath).
				Description("The Bloblang file to execute. Relative paths are resolved against the working directory of the process.").
				Example("mappings/vehicle_event.blobl").
				LintRule(`root = `+lintFunctionName+`(this)`),
			service.NewDurationField(mfFieldReloadInterval).
				Description("How often the file (and its imports) is checked for changes. `0s` disables reloading.").
				Default("2s"),
		).
		Example("Per API type", "Maps each message with the file for its API type; editing either file takes effect within a few seconds.", `
pipeline:
  processors:
    - switch:
        - check: '@api_type == "VEHICLE_EVENT"'
          processors:
            - label: map_vehicle_event
              mapping_file:
                path: mappings/vehicle_event.blobl
                reload_interval: 2s
        - check: '@api_type == "HEARTBEAT"'
          processors:
            - label: map_heartbeat
              mapping_file:
                path: mappings/heartbeat.blobl
`)
}

func init() {
	// Registered before the processor spec: its lint rule is compiled when the
	// spec is built and must find the function. It reads files, yet it is
	// registered pure: Benthos runs lint rules with pure functions only.
	// mappingEnvironment leaves it out by name.
	bloblang.MustRegisterFunctionV2(lintFunctionName, bloblang.NewPluginSpec().
		Category("Environment").
		Description("Compiles the Bloblang file at `path` (relative to the working directory) and returns its errors as an array of strings, empty when it compiles. Used by `forwarder lint` for the `mapping_file` processor. It reads files but changes nothing.").
		Param(bloblang.NewStringParam("path").Description("The Bloblang file to check.")),
		func(args *bloblang.ParsedParams) (bloblang.Function, error) {
			path, err := args.GetString("path")
			if err != nil {
				return nil, err
			}
			return func() (any, error) {
				if _, _, err := compileMappingFile(osFiles{}, path); err != nil {
					return []any{err.Error()}, nil
				}
				return []any{}, nil
			}, nil
		})

	service.MustRegisterBatchProcessor("mapping_file", mappingFileSpec(),
		func(conf *service.ParsedConfig, res *service.Resources) (service.BatchProcessor, error) {
			return newMappingFileFromParsed(conf, res)
		})
}

// compiledMapping is one immutable version of the mapping.
type compiledMapping struct {
	exec *bloblang.Executor
	sum  [sha256.Size]byte
}

type mappingFileProc struct {
	path     string
	interval time.Duration
	settle   time.Duration
	files    fileReader
	log      *service.Logger
	reloads  *service.MetricCounter

	current atomic.Pointer[compiledMapping]

	// watched is what the watch loop last saw of every file the last compile
	// attempt read; only the watch goroutine touches it after construction.
	watched map[string]fileState

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newMappingFileFromParsed(conf *service.ParsedConfig, res *service.Resources) (*mappingFileProc, error) {
	path, err := conf.FieldString(mfFieldPath)
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("mapping_file: path is empty: set it to a .blobl file")
	}
	interval, err := conf.FieldDuration(mfFieldReloadInterval)
	if err != nil {
		return nil, err
	}
	if interval < 0 {
		return nil, fmt.Errorf("mapping_file: reload_interval %v is negative: use 0s to disable reloading", interval)
	}
	return newMappingFile(path, interval, resourceFiles{res.FS()}, res.Logger(), res.Metrics())
}

func newMappingFile(path string, interval time.Duration, files fileReader, log *service.Logger, metrics *service.Metrics) (*mappingFileProc, error) {
	p := &mappingFileProc{
		path:     path,
		interval: interval,
		settle:   min(interval/2, 200*time.Millisecond),
		files:    files,
		log:      log,
		reloads:  metrics.NewCounter(metricReloads, "result"),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	// Both series exist from start, at 0, so that dashboards and alerts
	// on rejected reloads see a value before the first reload happens.
	for _, result := range []string{"success", "error"} {
		p.reloads.Incr(0, result)
	}
	m, watched, err := compileMappingFile(files, path)
	if err != nil {
		return nil, fmt.Errorf("mapping_file: %w", err)
	}
	p.current.Store(m)
	p.watched = watched
	if interval > 0 {
		go p.watch()
	} else {
		close(p.done)
	}
	return p, nil
}

// ProcessBatch maps every message with the mapping current when the batch
// arrives.
func (p *mappingFileProc) ProcessBatch(_ context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	// Taken once: a reload during the batch applies from the next batch on.
	m := p.current.Load()
	exec := batch.BloblangExecutor(m.exec)
	out := make(service.MessageBatch, 0, len(batch))
	for i, msg := range batch {
		res, err := exec.Query(i)
		if err != nil {
			p.log.Debugf("mapping %s failed: %s", p.path, cutReason(capQuoted(err.Error())))
			failed := msg.Copy()
			failed.SetError(errors.New(mappingErrorReason(err)))
			out = append(out, failed)
			continue
		}
		if res != nil {
			out = append(out, res)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []service.MessageBatch{out}, nil
}

// Close stops watching the file.
func (p *mappingFileProc) Close(ctx context.Context) error {
	p.closeOnce.Do(func() { close(p.stop) })
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *mappingFileProc) watch() {
	defer close(p.done)
	ticker := time.NewTicker(p.interval)
	defer ticker.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-ticker.C:
			p.checkOnce()
		}
	}
}

// checkOnce reloads the mapping when one of its files changed and settled.
// It reports whether a reload was attempted.
func (p *mappingFileProc) checkOnce() bool {
	if !p.changed(p.watched) {
		return false
	}
	// A file written in place can be caught half-written, and a truncated
	// mapping may well compile: only take content that stayed the same for
	// the settle period.
	first := p.snapshot()
	select {
	case <-p.stop:
		return false
	case <-time.After(p.settle):
	}
	if p.changed(first) {
		return false // still being written: the next tick looks again
	}

	m, watched, err := compileMappingFile(p.files, p.path)
	p.watched = watched
	// The fields say the same for tools that follow the log (the dev
	// stack's screen shows reloads).
	if err != nil {
		p.reloads.Incr(1, "error")
		p.log.With("mapping_file", p.path, "mapping_reload", "rejected", "error", err.Error()).
			Errorf("Rejected the edit of mapping file %s, the previous mapping keeps serving: %v", p.path, err)
		return true
	}
	p.current.Store(m)
	p.reloads.Incr(1, "success")
	sum := fmt.Sprintf("%x", m.sum[:6])
	p.log.With("mapping_file", p.path, "mapping_reload", "success", "sha256", sum).
		Infof("Reloaded mapping file %s (sha256 %s)", p.path, sum)
	return true
}

// snapshot reads the current state of the watched files.
func (p *mappingFileProc) snapshot() map[string]fileState {
	snap := make(map[string]fileState, len(p.watched))
	for name := range p.watched {
		snap[name] = readState(p.files, name)
	}
	return snap
}

// changed reports whether any file differs from its state in seen.
func (p *mappingFileProc) changed(seen map[string]fileState) bool {
	for name, old := range seen {
		if p.fileChanged(name, old, seen) {
			return true
		}
	}
	return false
}

func (p *mappingFileProc) fileChanged(name string, old fileState, seen map[string]fileState) bool {
	info, err := p.files.Stat(name)
	if err != nil {
		return old.err == nil || old.err.Error() != err.Error()
	}
	if old.err == nil && !old.racy && info.ModTime().Equal(old.modTime) && info.Size() == old.size {
		return false
	}
	now := readState(p.files, name)
	if now.err == nil && old.err == nil && now.sum == old.sum {
		// Same content (a touch, or a racy re-read): remember the new stat so
		// the next poll takes the fast path again.
		seen[name] = now
		return false
	}
	return true
}

// fileState is what the watcher knows about one file.
type fileState struct {
	modTime time.Time
	size    int64
	sum     [sha256.Size]byte
	err     error
	// racy is set when the file was modified so shortly before it was read
	// that a further write could keep the same modification time and size;
	// such a file is compared by content on the next poll.
	racy bool
}

// racyWindow covers file systems with coarse modification times.
const racyWindow = 2 * time.Second

func readState(files fileReader, name string) fileState {
	readAt := time.Now()
	info, err := files.Stat(name)
	if err != nil {
		return fileState{err: err}
	}
	content, err := files.ReadFile(name)
	if err != nil {
		return fileState{err: err}
	}
	return fileState{
		modTime: info.ModTime(),
		size:    info.Size(),
		sum:     sha256.Sum256(content),
		racy:    !readAt.After(info.ModTime().Add(racyWindow)),
	}
}

// compileMappingFile reads and compiles the mapping at path in
// mappingEnvironment, resolving imports against the directory of the file
// that contains them and refusing those outside the directory of path. It
// returns the state of every file it read.
func compileMappingFile(files fileReader, path string) (*compiledMapping, map[string]fileState, error) {
	readAt := time.Now()
	watched := map[string]fileState{}
	var all bytes.Buffer
	read := func(name string) ([]byte, error) {
		info, err := files.Stat(name)
		if err != nil {
			watched[name] = fileState{err: err}
			return nil, err
		}
		content, err := files.ReadFile(name)
		if err != nil {
			watched[name] = fileState{err: err}
			return nil, err
		}
		watched[name] = fileState{
			modTime: info.ModTime(),
			size:    info.Size(),
			sum:     sha256.Sum256(content),
			racy:    !readAt.After(info.ModTime().Add(racyWindow)),
		}
		all.WriteString(name)
		all.WriteByte(0)
		all.Write(content)
		all.WriteByte(0)
		return content, nil
	}

	content, err := read(path)
	if err != nil {
		return nil, watched, fmt.Errorf("reading mapping file: %w", err)
	}
	root := filepath.Dir(path)
	env := mappingEnvironment().WithCustomImporter(importer(root, filepath.Dir(path), read))
	exec, err := env.Parse(string(content))
	if err != nil {
		var perr *bloblang.ParseError
		if errors.As(err, &perr) {
			return nil, watched, fmt.Errorf("compiling %s", withHostHint(describeParseError(files, root, path, string(content), perr)))
		}
		return nil, watched, fmt.Errorf("compiling %s: %s", path, withHostHint(err.Error()))
	}
	return &compiledMapping{exec: exec, sum: sha256.Sum256(all.Bytes())}, watched, nil
}

// mappingEnvironment is the Bloblang environment mapping files are compiled
// in: the global one (Benthos's functions and methods, and ours) without
// those that read the host, so that a mapping cannot put a secret (the
// database URL, a file) into an error that reaches an outbox row, a log or
// the console (mappings/README.md, "What a mapping may read").
//
// What is left out is what Benthos marks impure (env, file, file_rel,
// hostname, count today, and whatever a later release marks so), plus
// mapping_file_lint, which reads files too; ts_format_platform stays: it is
// impure only for reading PLATFORM_TZ, the zone the mappings need. The
// clock (now, timestamp_unix) stays, as Benthos's OnlyPure keeps it.
var mappingEnvironment = sync.OnceValue(func() mappingEnv {
	global := bloblang.GlobalEnvironment()
	pure := global.OnlyPure()
	var funcs, methods []string
	pureFuncs := map[string]bool{}
	pure.WalkFunctions(func(name string, _ *bloblang.FunctionView) { pureFuncs[name] = true })
	global.WalkFunctions(func(name string, _ *bloblang.FunctionView) {
		if !pureFuncs[name] || name == lintFunctionName {
			funcs = append(funcs, name)
		}
	})
	pureMethods := map[string]bool{}
	pure.WalkMethods(func(name string, _ *bloblang.MethodView) { pureMethods[name] = true })
	global.WalkMethods(func(name string, _ *bloblang.MethodView) {
		if !pureMethods[name] && name != tsFormatPlatformName {
			methods = append(methods, name)
		}
	})
	left := make(map[string]bool, len(funcs)+len(methods))
	for _, name := range append(funcs, methods...) {
		left[name] = true
	}
	return mappingEnv{global.WithoutFunctions(funcs...).WithoutMethods(methods...), left}
})

// mappingEnv is the environment of mapping files and the names of the
// functions and methods it leaves out.
type mappingEnv struct {
	*bloblang.Environment
	leftOut map[string]bool
}

// unrecognised finds the name in Bloblang's error for a function or method
// an environment does not have.
var unrecognised = regexp.MustCompile(`unrecognised (?:function|method) '([^']+)'`)

// withHostHint adds why to a compile error about a function or method that
// mapping files may not use: Bloblang only says it does not know it.
func withHostHint(msg string) string {
	if m := unrecognised.FindStringSubmatch(msg); m != nil && mappingEnvironment().leftOut[m[1]] {
		return msg + " (" + m[1] + " is not available in mapping files: they cannot read the environment, files or the host; see mappings/README.md)"
	}
	return msg
}

// importer resolves an import in a file of dir against dir, as Bloblang
// does, and refuses a file outside root, the mapping file's directory: an
// import of /proc/self/environ would fail to parse with an error quoting
// its start. read reads the file.
func importer(root, dir string, read func(string) ([]byte, error)) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		if !within(root, name) {
			return nil, fmt.Errorf("import %s is outside %s: a mapping may import only files in its own directory", name, root)
		}
		return read(name)
	}
}

// within reports whether path is root or lies under it, by their cleaned
// names (a symlink inside root is followed: only who can write to root can
// make one).
func within(root, path string) bool {
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// structuralPrefix matches the context Bloblang adds around an error raised
// inside a mapping; the reason itself (a throw() message, or a field's type
// error such as "field `this.x`: ...") is what remains.
// An object literal adds "failed to resolve 'key' value: " (Benthos
// query/literals.go); keys are mapping fields, so they hold no quote.
var structuralPrefix = regexp.MustCompile(`^(?:failed assignment \(line \d+\): |failed to process element \d+: |map [\w-]+: |(?:if|match) expression: |failed to resolve '[^']*' value: )`)

// mappingErrorReason returns the reason of a mapping error without its
// structural prefixes, every quoted value in it cut to maxQuotedBytes and
// the whole to maxReasonBytes.
func mappingErrorReason(err error) string {
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

// fileReader is the file access the processor needs: the stream's FS in a
// running stream, the OS for lint.
type fileReader interface {
	Stat(name string) (fs.FileInfo, error)
	ReadFile(name string) ([]byte, error)
}

type resourceFiles struct{ fs *service.FS }

func (r resourceFiles) Stat(name string) (fs.FileInfo, error) { return r.fs.Stat(name) }

func (r resourceFiles) ReadFile(name string) ([]byte, error) {
	f, err := r.fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

type osFiles struct{}

func (osFiles) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }
func (osFiles) ReadFile(name string) ([]byte, error)  { return os.ReadFile(name) }
