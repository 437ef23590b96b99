package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	referenceDir = "../../docs/reference"
	srcRoot      = "../.."
	regenerate   = "docs/reference is stale: run `go generate ./docs` (or `make docs`) from the repository root and commit the result"
)

// TestReferenceIsCurrent fails when a plugin's spec changed and
// docs/reference was not regenerated.
func TestReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := write(dir, srcRoot); err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	have, _ := filepath.Glob(filepath.Join(referenceDir, "*.md"))
	base := func(ps []string) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = filepath.Base(p)
		}
		return out
	}
	if !slices.Equal(base(want), base(have)) {
		t.Fatalf("%s: pages %v, generated %v", regenerate, base(have), base(want))
	}
	for _, p := range want {
		gen, _ := os.ReadFile(p)
		cur, err := os.ReadFile(filepath.Join(referenceDir, filepath.Base(p)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gen, cur) {
			t.Errorf("%s: %s differs", regenerate, filepath.Base(p))
		}
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	pages, err := render(srcRoot)
	if err != nil {
		t.Fatal(err)
	}
	// Every component we register, and none of Benthos's (docgen imports
	// only plugins/all).
	for page, names := range map[string][]string{
		"inputs.md":     {"kafka_franz", "outbox_retry", "outbox_dead_letter"},
		"processors.md": {"outbox", "mapping_file"},
		"outputs.md":    {"http_forwarder", "kafka_franz"},
		"metrics.md":    {"prometheus"},
		"tracers.md":    {"otlp"},
		"bloblang.md":   {"percent_round", "ts_format_platform"},
	} {
		text := string(pages[page])
		for _, n := range names {
			if !strings.Contains(text, "\n## "+n+"\n") {
				t.Errorf("%s has no section for %s", page, n)
			}
		}
		if got := strings.Count(text, "\n## "); got != len(names) {
			t.Errorf("%s has %d sections, want %d (%v)", page, got, len(names), names)
		}
	}
	for page, text := range pages {
		for _, helper := range []string{"http_forwarder_rule_lints", "http_forwarder_lease_lints", "mapping_file_lint"} {
			if strings.Contains(string(text), "## "+helper) {
				t.Errorf("%s documents the lint helper %s", page, helper)
			}
		}
	}
	// The spec's own words reach the page: a field description.
	if !strings.Contains(string(pages["outputs.md"]), "#### `max_in_flight`") {
		t.Error("outputs.md lacks http_forwarder's max_in_flight field")
	}
}
