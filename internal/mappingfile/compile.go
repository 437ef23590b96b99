// Package mappingfile compiles the Bloblang mapping files the pipeline maps
// messages with: the language they are written in (Benthos's functions and
// methods without those that read the host, plus percent_round and
// ts_format_platform), imports confined to the mapping's directory, errors
// that say which file, line and column, and the reasons a failing mapping
// flags a message with. The mapping_file processor (plugins/mapping) runs
// and reloads them; `forwarder test`, `outbox show` and the console preview
// with CompileFile. It knows nothing of streams.
package mappingfile

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/bloblang"

	// Event times are formatted in PLATFORM_TZ: embed the zone database so a
	// host or container without /usr/share/zoneinfo still knows Asia/Shanghai.
	_ "time/tzdata"
)

// LintFunction is the Bloblang function behind the mapping_file
// processor's lint rule, so that `forwarder lint` compiles the referenced
// file. Mapping files cannot call it.
const LintFunction = "mapping_file_lint"

func init() {
	// It reads files, yet it is registered pure: Benthos runs lint rules
	// with pure functions only. mappingEnvironment leaves it out by name.
	bloblang.MustRegisterFunctionV2(LintFunction, bloblang.NewPluginSpec().
		Category("Environment").
		Description("Compiles the Bloblang file at `path` (relative to the working directory) and returns its errors as an array of strings, empty when it compiles. Used by `forwarder lint` for the `mapping_file` processor. It reads files but changes nothing.").
		Param(bloblang.NewStringParam("path").Description("The Bloblang file to check.")),
		func(args *bloblang.ParsedParams) (bloblang.Function, error) {
			path, err := args.GetString("path")
			if err != nil {
				return nil, err
			}
			return func() (any, error) {
				if _, _, err := Compile(OSFiles{}, path); err != nil {
					return []any{err.Error()}, nil
				}
				return []any{}, nil
			}, nil
		})
}

// Mapping is one immutable version of a compiled mapping file.
type Mapping struct {
	Exec *bloblang.Executor
	// Sum is the content of every file the mapping was compiled from.
	Sum [sha256.Size]byte
}

// Files is what was last seen of every file a mapping was compiled from,
// by name.
type Files map[string]FileState

// Snapshot reads the current state of the files.
func (seen Files) Snapshot(files FileReader) Files {
	snap := make(Files, len(seen))
	for name := range seen {
		snap[name] = readState(files, name)
	}
	return snap
}

// Changed reports whether any file differs from its state in seen. A file
// whose content is unchanged (a touch) gets its new state recorded, so the
// next call takes the fast path again.
func (seen Files) Changed(files FileReader) bool {
	for name, old := range seen {
		if seen.fileChanged(files, name, old) {
			return true
		}
	}
	return false
}

func (seen Files) fileChanged(files FileReader, name string, old FileState) bool {
	info, err := files.Stat(name)
	if err != nil {
		return old.err == nil || old.err.Error() != err.Error()
	}
	if old.err == nil && !old.racy && info.ModTime().Equal(old.modTime) && info.Size() == old.size {
		return false
	}
	now := readState(files, name)
	if now.err == nil && old.err == nil && now.sum == old.sum {
		seen[name] = now
		return false
	}
	return true
}

// FileState is what the watcher knows about one file.
type FileState struct {
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

func readState(files FileReader, name string) FileState {
	readAt := time.Now()
	info, err := files.Stat(name)
	if err != nil {
		return FileState{err: err}
	}
	content, err := files.ReadFile(name)
	if err != nil {
		return FileState{err: err}
	}
	return FileState{
		modTime: info.ModTime(),
		size:    info.Size(),
		sum:     sha256.Sum256(content),
		racy:    !readAt.After(info.ModTime().Add(racyWindow)),
	}
}

// Compile reads and compiles the mapping at path in
// mappingEnvironment, resolving imports against the directory of the file
// that contains them and refusing those outside the directory of path. It
// returns the state of every file it read.
func Compile(files FileReader, path string) (*Mapping, Files, error) {
	readAt := time.Now()
	watched := Files{}
	var all bytes.Buffer
	read := func(name string) ([]byte, error) {
		info, err := files.Stat(name)
		if err != nil {
			watched[name] = FileState{err: err}
			return nil, err
		}
		content, err := files.ReadFile(name)
		if err != nil {
			watched[name] = FileState{err: err}
			return nil, err
		}
		watched[name] = FileState{
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
	return &Mapping{Exec: exec, Sum: sha256.Sum256(all.Bytes())}, watched, nil
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
		if !pureFuncs[name] || name == LintFunction {
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

// FileReader is the file access compiling and watching need: the stream's
// FS in a running stream, the OS for lint and the tools.
type FileReader interface {
	Stat(name string) (fs.FileInfo, error)
	ReadFile(name string) ([]byte, error)
}

// OSFiles reads the process's file system.
type OSFiles struct{}

func (OSFiles) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }
func (OSFiles) ReadFile(name string) ([]byte, error)  { return os.ReadFile(name) }
