// Package testinputs makes go test's result cache see the inputs of a test
// that reaches them through a child process.
//
// go test caches a passing result and replays it ("(cached)") until the test
// binary, or a file or environment variable the test consulted, changes. It
// learns what the test consulted from the test process itself, while the
// tests run (not in TestMain before m.Run): files inside the module opened,
// stat'ed or started as a process through the os package, and variables read
// with os.Getenv. A forwarder started as a child process reads the pipeline
// and the mappings itself, so a test of the binary replayed a green result
// after a mapping or the pipeline changed; a binary the test built from the
// module's sources lives outside the module, so its sources were not seen
// either. Forwarder declares all of them:
//
//	cmd := exec.Command(testinputs.Forwarder(t, forwarderBin), args...)
//
// Proof: test/testcache_check.sh runs a package twice (the second run is
// "(cached)"), touches a mapping, the pipeline and the binary, and shows the
// run after each is not.
package testinputs

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// BinEnv names the variable that points the tests at a built forwarder
// (`make test` sets it to bin/forwarder); unset, tests build their own.
const BinEnv = "FORWARDER_BIN"

// ShippedConfig are the directories a forwarder run on the shipped pipeline
// reads, relative to the module root.
var ShippedConfig = []string{"pipelines", "mappings"}

// sources are what a forwarder built from the module is built from,
// relative to the module root.
var sources = []string{"go.mod", "go.sum", "cmd", "plugins", "internal"}

var (
	declared   sync.Map // absolute path -> struct{}: declared in this process
	rootOnce   sync.Once
	moduleRoot string
	rootErr    error
)

// Forwarder declares what a test running the forwarder binary bin depends on,
// and returns bin: the shipped pipelines and mappings, the variable
// FORWARDER_BIN, and the binary's file when it is set or, when it is not (the
// test built bin from the module), the sources it was built from.
//
// A binary outside the module cannot be declared (go test only rechecks
// files inside the module): the test then logs that its cached result will
// not follow that binary.
func Forwarder(tb testing.TB, bin string) string {
	tb.Helper()
	Files(tb, ShippedConfig...)
	if os.Getenv(BinEnv) == "" {
		Files(tb, sources...)
		return bin
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		tb.Fatalf("%s=%s: %v", BinEnv, bin, err)
	}
	root := ModuleRoot(tb)
	if rel, err := filepath.Rel(root, abs); err != nil || !filepath.IsLocal(rel) {
		tb.Logf("%s=%s is outside the module %s: go test's cache cannot see it change; run with -count=1 after rebuilding it", BinEnv, bin, root)
	}
	Files(tb, abs)
	return bin
}

// Files declares files and directories (walked, every entry of each
// directory: an added, removed or edited file changes the cache key), given
// relative to the module root or absolute. Each is declared once per process.
func Files(tb testing.TB, paths ...string) {
	tb.Helper()
	root := ModuleRoot(tb)
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		if _, done := declared.LoadOrStore(p, struct{}{}); done {
			continue
		}
		// os.Stat records the file's size and modification time.
		info, err := os.Stat(p)
		if err != nil {
			tb.Fatalf("declaring test input %s: %v", p, err)
		}
		if !info.IsDir() {
			continue
		}
		if err := readDirs(p); err != nil {
			tb.Fatalf("declaring test input %s: %v", p, err)
		}
	}
}

// readDirs reads dir and every directory below it: reading a directory
// records its entries, with their sizes and modification times.
func readDirs(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := readDirs(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// ModuleRoot returns the directory of the go.mod above the working
// directory.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				moduleRoot = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = os.ErrNotExist
				return
			}
			dir = parent
		}
	})
	if rootErr != nil {
		tb.Fatalf("finding the module root (go.mod) above the working directory: %v", rootErr)
	}
	return moduleRoot
}
