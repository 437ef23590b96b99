package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/forwarder/forwarder/internal/mappingfile"
)

// checkTestMappings compiles the mapping file of every test case that
// targets one (`target_mapping`) in the test definitions the `test` command
// is about to run, and writes, for each that does not compile, where and
// why: the file, line and column, as `forwarder lint` gives them for the
// pipelines. Benthos's runner reports such a case only as "failed to
// initialise Bloblang mapping" with the parser's message, without the
// position. The tests run afterwards as usual (and that case fails).
func checkTestMappings(w io.Writer, args []string) {
	var seen []string
	for _, file := range expandLintPaths(args) {
		b, err := os.ReadFile(file)
		if err != nil {
			continue // Benthos reports it
		}
		var def struct {
			Tests []struct {
				TargetMapping string `yaml:"target_mapping"`
			} `yaml:"tests"`
		}
		if yaml.Unmarshal(b, &def) != nil {
			continue
		}
		for _, tc := range def.Tests {
			if tc.TargetMapping == "" {
				continue
			}
			// Relative to the test file, as Benthos resolves it.
			path := tc.TargetMapping
			if !filepath.IsAbs(path) {
				path = filepath.Join(filepath.Dir(file), path)
			}
			if slices.Contains(seen, path) {
				continue
			}
			seen = append(seen, path)
			if _, err := mappingfile.CompileFile(path); err != nil {
				fmt.Fprintf(w, "Mapping %s (target_mapping of %s) does not compile: %v\n", path, file, err)
			}
		}
	}
}
