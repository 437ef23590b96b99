// Package pipelines_test checks the shipped configuration with the real
// binary: `forwarder lint` and `forwarder test` pass on pipelines/ and
// mappings/, and a broken copy of the pipeline or of a mapping fails lint with
// the line of the mistake.
package pipelines_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

// forwarder builds cmd/forwarder once per test binary, or returns
// $FORWARDER_BIN when set (an already built binary).
func forwarder(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("FORWARDER_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "forwarder-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "forwarder")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/forwarder")
		cmd.Dir = testinputs.ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/forwarder: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// run runs the binary in dir with the environment the docs promise lint
// works in: no credentials, and PLATFORM_TZ at its default.
func run(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testinputs.Forwarder(t, forwarder(t)), args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD", "PLATFORM_TZ":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("running forwarder %v: %v", args, err)
		}
		code = exitErr.ExitCode()
	}
	return string(out), code
}

// copyTree copies pipelines/ and mappings/ into a fresh directory, the way
// the service is deployed: paths relative to the working directory.
func copyTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	for _, sub := range []string{"pipelines", "mappings"} {
		src := filepath.Join(testinputs.ModuleRoot(t), sub)
		entries, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dst, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() || strings.HasSuffix(e.Name(), ".go") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, sub, e.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dst
}

// replaceLine replaces the only line of file containing old with the same
// line where old becomes new, and returns its 1-based number.
func replaceLine(t *testing.T, file, old, new string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	found := 0
	for i, l := range lines {
		if strings.Contains(l, old) {
			if found != 0 {
				t.Fatalf("%q occurs more than once in %s", old, file)
			}
			lines[i] = strings.Replace(l, old, new, 1)
			found = i + 1
		}
	}
	if found == 0 {
		t.Fatalf("%q not found in %s", old, file)
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return found
}

func lineOf(t *testing.T, file, substr string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) {
			return i + 1
		}
	}
	t.Fatalf("%q not found in %s", substr, file)
	return 0
}

func TestShippedConfig(t *testing.T) {
	t.Run("LintPasses", func(t *testing.T) {
		out, code := run(t, testinputs.ModuleRoot(t), "lint", "./pipelines/...", "./mappings/...")
		if code != 0 {
			t.Fatalf("forwarder lint exited %d:\n%s", code, out)
		}
	})

	t.Run("TestsPass", func(t *testing.T) {
		out, code := run(t, testinputs.ModuleRoot(t), "test", "./pipelines/...", "./mappings/...")
		if code != 0 {
			t.Fatalf("forwarder test exited %d:\n%s", code, out)
		}
		for _, want := range []string{"pipelines/forwarder.yaml", "mappings/vehicle_event_test.yaml", "mappings/heartbeat_test.yaml"} {
			if !strings.Contains(out, "Test '"+want+"' succeeded") {
				t.Errorf("forwarder test did not run %s:\n%s", want, out)
			}
		}
	})
}

func TestBrokenCopyFailsLint(t *testing.T) {
	t.Run("Pipeline", func(t *testing.T) {
		dir := copyTree(t)
		file := filepath.Join(dir, "pipelines", "forwarder.yaml")
		line := replaceLine(t, file, "    timeout: ${FORWARD_TIMEOUT:10s}", "    timout: ${FORWARD_TIMEOUT:10s}")

		out, code := run(t, dir, "lint", "./pipelines/...")
		if code != 1 {
			t.Fatalf("forwarder lint exited %d, want 1:\n%s", code, out)
		}
		want := fmt.Sprintf("pipelines/forwarder.yaml(%d,", line)
		if !strings.Contains(out, want) || !strings.Contains(out, "timout") {
			t.Fatalf("lint output does not point at %s...) and the misspelt field:\n%s", want, out)
		}
	})

	t.Run("Mapping", func(t *testing.T) {
		dir := copyTree(t)
		mapping := filepath.Join(dir, "mappings", "vehicle_event.blobl")
		line := replaceLine(t, mapping, `.apply("enter_state")`, `.aply("enter_state")`)
		pipeline := filepath.Join(dir, "pipelines", "forwarder.yaml")
		pathLine := lineOf(t, pipeline, "path: mappings/vehicle_event.blobl")

		out, code := run(t, dir, "lint", "./pipelines/...")
		if code != 1 {
			t.Fatalf("forwarder lint exited %d, want 1:\n%s", code, out)
		}
		// The lint is reported at the pipeline's path field and names the
		// mapping's own line and column.
		re := regexp.MustCompile(fmt.Sprintf(`pipelines/forwarder\.yaml\(%d,\d+\) .*mappings/vehicle_event\.blobl:%d:\d+: .*aply`, pathLine, line))
		if !re.MatchString(out) {
			t.Fatalf("lint output does not match %s:\n%s", re, out)
		}

		// forwarder test fails on it too.
		out, code = run(t, dir, "test", "./mappings/...")
		if code == 0 {
			t.Fatalf("forwarder test passed on a broken mapping:\n%s", out)
		}
	})
}
