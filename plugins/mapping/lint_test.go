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
	linttest.Component{Kind: linttest.Processor, Name: "mapping_file", Spec: mappingFileSpec(), Base: fmt.Sprintf("path: %q\n", path),
		Build: func(conf *service.ParsedConfig) error {
			p, err := newMappingFileFromParsed(conf, service.MockResources())
			if err == nil {
				err = p.Close(t.Context())
			}
			return err
		}}.Run(t, []linttest.Case{
		{Name: "ReloadIntervalNegative", YAML: "reload_interval: -1ns", Want: "mapping_file: reload_interval -1ns is negative: use 0s to disable reloading"},
		{Name: "ReloadIntervalNotADuration", YAML: "reload_interval: 2", Want: "failed to parse 'reload_interval' as a duration string"},
		{Name: "ReloadIntervalZero", YAML: "reload_interval: 0s"},
	})
}
