package mapping

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.blobl")
	if err := os.WriteFile(path, []byte("root = this\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrap := func(conf string) string {
		return "input:\n  generate:\n    mapping: 'root = {}'\npipeline:\n  processors:\n    - mapping_file:\n" + linttest.Indent(conf, "        ") + "output:\n  drop: {}\n"
	}
	start := func(yaml string) error {
		conf, err := mappingFileSpec().ParseYAML(yaml, nil)
		if err != nil {
			return err
		}
		p, err := newMappingFileFromParsed(conf, service.MockResources())
		if err == nil {
			err = p.Close(t.Context())
		}
		return err
	}
	linttest.Run(t, fmt.Sprintf("path: %q\n", path), wrap, start, []linttest.Case{
		{Name: "ReloadIntervalNegative", YAML: "reload_interval: -1ns", Want: "mapping_file: reload_interval -1ns is negative: use 0s to disable reloading"},
		{Name: "ReloadIntervalNotADuration", YAML: "reload_interval: 2", Want: "failed to parse 'reload_interval' as a duration string"},
		{Name: "ReloadIntervalZero", YAML: "reload_interval: 0s"},
	})
}
