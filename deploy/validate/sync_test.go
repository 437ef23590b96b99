package validate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/deploy/validate/chartfiles"
)

// TestChartFilesAreCurrent: the chart's copies of the alert rules, the
// dashboard, the pipeline and the mappings equal their sources. A chart
// cannot read outside itself, so `make chart-sync` copies them in.
func TestChartFilesAreCurrent(t *testing.T) {
	t.Parallel()
	stale, err := chartfiles.Stale(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Fatalf("the chart's files are stale; run `make chart-sync`:\n  %s", strings.Join(stale, "\n  "))
	}
}

// TestChartSync: Sync brings a stale copy back, adds a new mapping and
// removes the copy of one that is gone, and Stale reports each case.
func TestChartSync(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("deploy/prometheus/alerts.yml", "groups: []\n")
	write("deploy/grafana/forwarder-dashboard.json", "{}\n")
	write("pipelines/forwarder.yaml", "input: {}\n")
	write("mappings/a.blobl", "root = this\n")
	write("mappings/a_test.yaml", "tests: []\n")
	write("mappings/README.md", "not shipped\n")
	if _, err := chartfiles.Sync(root); err != nil {
		t.Fatal(err)
	}
	if stale, _ := chartfiles.Stale(root); len(stale) != 0 {
		t.Fatalf("stale right after a sync: %v", stale)
	}
	if _, err := os.Stat(filepath.Join(root, chartfiles.ChartDir, "files/mappings/README.md")); !os.IsNotExist(err) {
		t.Errorf("README.md was copied into the chart: %v", err)
	}

	write("pipelines/forwarder.yaml", "input: {changed: true}\n")
	write("mappings/b.blobl", "root = 1\n")
	if err := os.Remove(filepath.Join(root, "mappings/a_test.yaml")); err != nil {
		t.Fatal(err)
	}
	stale, err := chartfiles.Stale(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		chartfiles.ChartDir + "/files/mappings/a_test.yaml has no source in mappings/",
		chartfiles.ChartDir + "/files/mappings/b.blobl is missing (copy of mappings/b.blobl)",
		chartfiles.ChartDir + "/files/pipelines/forwarder.yaml differs from pipelines/forwarder.yaml",
	}
	if strings.Join(stale, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Stale:\n%s\nwant:\n%s", strings.Join(stale, "\n"), strings.Join(want, "\n"))
	}
	if _, err := chartfiles.Sync(root); err != nil {
		t.Fatal(err)
	}
	if stale, _ := chartfiles.Stale(root); len(stale) != 0 {
		t.Fatalf("stale after the second sync: %v", stale)
	}
}
