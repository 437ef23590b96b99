package mapping

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	// The binary has Benthos's io components, and with them env(), file()
	// and hostname(): without them this test would prove nothing.
	_ "github.com/redpanda-data/benthos/v4/public/components/io"

	"github.com/forwarder/forwarder/internal/mappingfile"
)

// TestMappingFilesCannotReadTheHost compiles mapping files that read the
// environment, files or the host, directly or through an import from
// outside the mapping's directory, and requires each to be refused at
// compile time with an error that says why and holds nothing it read
// (mappings/README.md): by the processor at start-up and on reload, by
// forwarder lint, and by the preview of outbox show and the console. What the
// shipped mappings use (percent_round, ts_format_platform, imports within the
// directory) keeps working.
//
// Not parallel: it sets DATABASE_URL.
func TestMappingFilesCannotReadTheHost(t *testing.T) {
	const secret = "postgres://forwarder:S3cr3t-LEAKCHECK@db:5432/forwarder"
	t.Setenv("DATABASE_URL", secret)

	root := t.TempDir()
	dir := filepath.Join(root, "mappings")
	if err := os.MkdirAll(filepath.Join(dir, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A file outside the mappings directory that parses, and one that does
	// not (a parse error would quote its start).
	writeFile(t, filepath.Join(root, "outside.blobl"), "map leak {\n  root = \"outside\"\n}\n")
	writeFile(t, filepath.Join(root, "secret.txt"), secret+"\n")
	writeFile(t, filepath.Join(dir, "lib", "ok.blobl"), "map ok {\n  root = this.percent_round()\n}\n")

	for _, tc := range []struct {
		name, mapping string
		why           string // in the error
	}{
		{"Env", `root = throw(env("DATABASE_URL"))`, "env is not available in mapping files: they cannot read the environment, files or the host"},
		{"EnvInAnExpression", "root = this\nroot.x = env(\"DATABASE_URL\").or(\"\")", "env is not available in mapping files"},
		{"File", `root = file("/etc/passwd")`, "file is not available in mapping files"},
		{"FileOfASecret", fmt.Sprintf(`root = throw(file(%q).string())`, filepath.Join(root, "secret.txt")), "file is not available in mapping files"},
		{"FileRel", `root = file_rel("../secret.txt")`, "file_rel is not available in mapping files"},
		{"Hostname", `root = hostname()`, "hostname is not available in mapping files"},
		{"TheLintFunction", fmt.Sprintf(`root = throw(mapping_file_lint(%q).index(0))`, filepath.Join(root, "secret.txt")), "mapping_file_lint is not available in mapping files"},
		{"ImportOfAnAbsolutePath", "import \"/etc/passwd\"\nroot = this", "is outside " + dir},
		{"ImportOfASecret", fmt.Sprintf("import %q\nroot = this", filepath.Join(root, "secret.txt")), "is outside " + dir},
		{"ImportUpwards", "import \"../outside.blobl\"\nroot = this.apply(\"leak\")", "is outside " + dir},
		{"ImportUpwardsFromASubdirectory", "import \"./lib/up.blobl\"\nroot = this", "is outside " + dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, filepath.Join(dir, "lib", "up.blobl"), "import \"../../outside.blobl\"\nmap up {\n  root = this\n}\n")
			path := filepath.Join(dir, "m.blobl")
			writeFile(t, path, tc.mapping)
			check := func(what string, err error) {
				t.Helper()
				switch {
				case err == nil:
					t.Errorf("%s: compiled; want it refused", what)
				case !strings.Contains(err.Error(), tc.why):
					t.Errorf("%s: %v; want an error saying %q", what, err, tc.why)
				case strings.Contains(err.Error(), "LEAKCHECK") || strings.Contains(err.Error(), "root:"):
					t.Errorf("%s: the error holds what it read: %v", what, err)
				}
			}
			_, err := newMappingFile(path, 0, mappingfile.OSFiles{}, service.MockResources().Logger(), service.MockResources().Metrics())
			check("the processor", err)
			_, err = mappingfile.CompileFile(path)
			check("the preview", err)
			if lints := lintMappingFile(t, path); len(lints) != 1 {
				t.Errorf("forwarder lint: %v, want one lint", lints)
			} else {
				check("forwarder lint", fmt.Errorf("%s", lints[0]))
			}
		})
	}

	t.Run("WhatTheShippedMappingsUseStillWorks", func(t *testing.T) {
		path := filepath.Join(dir, "m.blobl")
		writeFile(t, path, `import "./lib/ok.blobl"
root.credibility = this.p.apply("ok")
root.at = (this.t / 1000).floor().ts_format_platform("2006-01-02 15:04:05")
root.now_is_allowed = now().type()
`)
		exec, err := mappingfile.CompileFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Query(map[string]any{"p": json.Number("0.575"), "t": int64(1779330600000)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"credibility": int64(58), "at": "2026-05-21 10:30:00", "now_is_allowed": "string"}
		if fmt.Sprint(out) != fmt.Sprint(want) {
			t.Errorf("mapped %v, want %v", out, want)
		}
	})

	t.Run("AnEditThatReadsTheHostIsRejectedOnReload", func(t *testing.T) {
		tb := setup(t, `root.ok = true`)
		writeFile(t, tb.path, `root = throw(env("DATABASE_URL"))`)
		eventually(t, "the edit is rejected", func() bool { return tb.capture.counter(metricReloads, map[string]string{"result": "error"}) > 0 })
		if got := body(t, tb.mapOne(`{}`)); got != `{"ok":true}` {
			t.Errorf("after the rejected edit: %s, want the previous mapping's output", got)
		}
		if !tb.capture.logged("env is not available in mapping files") {
			t.Errorf("the rejection was not logged with the reason")
		}
	})
}

// lintMappingFile runs forwarder lint's check of a mapping_file processor
// on path and returns its lints.
func lintMappingFile(t *testing.T, path string) []string {
	t.Helper()
	config := fmt.Sprintf("input:\n  generate:\n    mapping: 'root = {}'\npipeline:\n  processors:\n    - mapping_file:\n        path: %q\noutput:\n  drop: {}\n", path)
	lints, err := service.GlobalEnvironment().FullConfigSchema("", "").NewStreamConfigLinter().LintYAML([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(lints))
	for i, l := range lints {
		out[i] = l.What
	}
	return out
}
