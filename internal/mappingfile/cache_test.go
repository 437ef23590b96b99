package mappingfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCompileFileKeepsTheCompiledMapping: a tool that previews mappings on
// every page view compiles a mapping once per content of its files: the
// same executor while nothing changed, a new one as soon as the file or a
// file it imports changed.
func TestCompileFileKeepsTheCompiledMapping(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	main, helper := filepath.Join(dir, "main.blobl"), filepath.Join(dir, "helper.blobl")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func() (any, any) {
		t.Helper()
		exec, err := CompileFile(main)
		if err != nil {
			t.Fatal(err)
		}
		v, err := exec.Query(nil)
		if err != nil {
			t.Fatal(err)
		}
		return exec, v
	}
	write(helper, "map word {\n  root = \"one\"\n}\n")
	write(main, "import \"./helper.blobl\"\nroot = null.apply(\"word\")\n")

	first, v := run()
	if v != "one" {
		t.Fatalf("mapping gave %v, want one", v)
	}
	if again, _ := run(); again != first {
		t.Error("compiled again although no file changed")
	}
	write(helper, "map word {\n  root = \"two\"\n}\n")
	changed, v := run()
	if changed == first || v != "two" {
		t.Errorf("after the imported file changed: same executor %v, result %v; want a new one giving two", changed == first, v)
	}
	write(main, "root = \"three\"\n")
	if _, v := run(); v != "three" {
		t.Errorf("after the file changed: %v, want three", v)
	}
	if err := os.Remove(main); err != nil {
		t.Fatal(err)
	}
	if _, err := CompileFile(main); err == nil {
		t.Error("a deleted mapping file still compiles")
	}
}
