// Package setup_test checks the set-up scripts that `make deps` and CI run.
package setup_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGo writes a go command that reports version v (and fails `go env` when
// envFails, as Go 1.19 can on a newer go.mod).
func fakeGo(t *testing.T, v string, envFails bool) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "go")
	env := "echo go" + v
	if envFails {
		env = "exit 2"
	}
	script := "#!/bin/sh\nif [ \"$1\" = env ]; then " + env + "; exit 0; fi\necho \"go version go" + v + " linux/amd64\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func checkGo(t *testing.T, goBin string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("../../.ci/check-go")
	cmd.Env = append(append(os.Environ(), "GO="+goBin), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestCheckGo(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, line := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(line, "go "); ok {
			want = strings.TrimSpace(v)
		}
	}

	if out, err := checkGo(t, fakeGo(t, want, false)); err != nil {
		t.Errorf("go%s, the version go.mod names: %v\n%s", want, err, out)
	}
	if out, err := checkGo(t, fakeGo(t, "1.99.0", false)); err != nil {
		t.Errorf("a newer Go: %v\n%s", err, out)
	}
	out, err := checkGo(t, fakeGo(t, "1.19.8", true))
	if err == nil || !strings.Contains(out, "go.mod needs Go "+want) || !strings.Contains(out, "https://go.dev/dl/go"+want+".linux-") {
		t.Errorf("Debian 12's Go 1.19: %v, want the version needed and where to get it:\n%s", err, out)
	}
	out, err = checkGo(t, fakeGo(t, "1.22.1", false), "GOTOOLCHAIN=local")
	if err == nil || !strings.Contains(out, "GOTOOLCHAIN=local keeps it from fetching") {
		t.Errorf("Go 1.22 with GOTOOLCHAIN=local: %v, want the GOTOOLCHAIN advice:\n%s", err, out)
	}
	out, err = checkGo(t, filepath.Join(t.TempDir(), "no-go"))
	if err == nil || !strings.Contains(out, "Go is not installed") {
		t.Errorf("no Go: %v\n%s", err, out)
	}
}
