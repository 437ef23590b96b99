package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/pgtest"

	// The suite runs bin/forwarder as a child process, so go test cannot see
	// that its result depends on the plugins' sources. Linking them in makes
	// the test binary, and with it go test's cached result, change whenever
	// the forwarder's code does.
	_ "github.com/forwarder/forwarder/internal/outboxcli"
	_ "github.com/forwarder/forwarder/plugins/all"
)

var (
	// repoRoot is the module root: the forwarders run there, because the
	// pipeline's mapping paths are relative to the working directory.
	repoRoot string
	// forwarderBin is the binary built from ./cmd/forwarder for this run, or
	// the one FORWARDER_BIN names.
	forwarderBin string
)

// TestMain builds the forwarder once, moves to the repository root and runs
// the scenarios with a PostgreSQL server (pgtest).
//
// The scenarios schedule themselves (scenario, in lanes): go test's
// -parallel, GOMAXPROCS by default, would hold them to two at a time
// whatever the lanes allow, and keep the longest from being let in first.
// Unless given on the command line it is raised above the number of
// scenarios, so that every one is running (waiting for its lane) and the
// lanes alone decide.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", "100"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			os.Exit(1)
		}
	}
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	pgtest.Main(m)
}

func setup() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(repoRoot, "go.mod")); err != nil {
		return fmt.Errorf("the repository root %s has no go.mod: %w", repoRoot, err)
	}
	if bin := os.Getenv("FORWARDER_BIN"); bin != "" {
		// A prebuilt binary instead of a fresh build: `make test` passes the
		// bin/forwarder it has just built.
		if forwarderBin, err = filepath.Abs(bin); err != nil {
			return err
		}
		return os.Chdir(repoRoot)
	}
	// go test runs the test binary from its temporary work directory and
	// removes that directory afterwards (pgtest.Main exits the process, so no
	// deferred cleanup of our own would run): the forwarder is built next to
	// it. A test binary run by hand from elsewhere builds into a fresh
	// temporary directory instead, left behind.
	dir, err := filepath.Abs(filepath.Dir(os.Args[0]))
	tmp, _ := filepath.Abs(os.TempDir())
	if err != nil || !strings.HasPrefix(dir, tmp+string(filepath.Separator)) || !writable(dir) {
		if dir, err = os.MkdirTemp("", "forwarder-e2e-"); err != nil {
			return err
		}
	}
	forwarderBin = filepath.Join(dir, "forwarder-e2e")
	cmd := exec.Command(goTool(), "build", "-o", forwarderBin, "./cmd/forwarder")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building ./cmd/forwarder: %w\n%s", err, out)
	}
	return os.Chdir(repoRoot)
}

// goTool is the go command: the one on PATH, else this toolchain's.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".e2e-probe-")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}
