// Package chartfiles keeps the Helm chart's copies of repository files in
// step with their sources. A chart can only read files inside itself, so
// deploy/helm/forwarder/files/ holds copies of the alert rules, the Grafana
// dashboard, the shipped pipeline and the mappings; `make chart-sync`
// refreshes them and a test fails when they are stale.
package chartfiles

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ChartDir is the chart, relative to the repository root.
const ChartDir = "deploy/helm/forwarder"

// Pair is one copied file, both paths relative to the repository root.
type Pair struct{ Source, Copy string }

// fixed are the single files; the mappings are added by Pairs.
var fixed = []Pair{
	{"deploy/prometheus/alerts.yml", ChartDir + "/files/alerts.yml"},
	{"deploy/grafana/forwarder-dashboard.json", ChartDir + "/files/forwarder-dashboard.json"},
	{"pipelines/forwarder.yaml", ChartDir + "/files/pipelines/forwarder.yaml"},
}

// mappingsCopy is where the mappings go: every one ends up in the
// mappings ConfigMap.
const mappingsCopy = ChartDir + "/files/mappings"

// isMappingFile reports whether a file of mappings/ ships in the chart:
// the Bloblang files and their `forwarder test` cases.
func isMappingFile(name string) bool {
	return strings.HasSuffix(name, ".blobl") || strings.HasSuffix(name, "_test.yaml")
}

// Pairs lists every copied file of the repository at root.
func Pairs(root string) ([]Pair, error) {
	pairs := append([]Pair(nil), fixed...)
	entries, err := os.ReadDir(filepath.Join(root, "mappings"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() && isMappingFile(e.Name()) {
			pairs = append(pairs, Pair{"mappings/" + e.Name(), mappingsCopy + "/" + e.Name()})
		}
	}
	return pairs, nil
}

// Stale lists what differs: copies whose content is not their source's,
// missing copies, and mapping copies whose source is gone.
func Stale(root string) ([]string, error) {
	stale, err := reconcile(root, false)
	sort.Strings(stale)
	return stale, err
}

// Sync copies every source over its copy and removes mapping copies whose
// source is gone. It returns what it changed.
func Sync(root string) ([]string, error) {
	return reconcile(root, true)
}

// reconcile compares every copy with its source and, when fix is set, makes
// it equal. It returns one line per difference (or change).
func reconcile(root string, fix bool) ([]string, error) {
	pairs, err := Pairs(root)
	if err != nil {
		return nil, err
	}
	var diffs []string
	want := map[string]bool{}
	for _, p := range pairs {
		want[p.Copy] = true
		src, err := os.ReadFile(filepath.Join(root, p.Source))
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(root, p.Copy)
		cp, err := os.ReadFile(dst)
		switch {
		case err == nil && bytes.Equal(src, cp):
			continue
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return nil, err
		case fix:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(dst, src, 0o644); err != nil {
				return nil, err
			}
			diffs = append(diffs, p.Copy)
		case err != nil:
			diffs = append(diffs, p.Copy+" is missing (copy of "+p.Source+")")
		default:
			diffs = append(diffs, p.Copy+" differs from "+p.Source)
		}
	}
	extra, err := extraMappings(root, want)
	if err != nil {
		return nil, err
	}
	for _, name := range extra {
		if !fix {
			diffs = append(diffs, name+" has no source in mappings/")
			continue
		}
		if err := os.Remove(filepath.Join(root, name)); err != nil {
			return nil, err
		}
		diffs = append(diffs, name+" (removed)")
	}
	return diffs, nil
}

// extraMappings are files in the chart's mappings copy that no source maps to.
func extraMappings(root string, want map[string]bool) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(root, mappingsCopy))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", mappingsCopy, err)
	}
	var extra []string
	for _, e := range entries {
		if name := mappingsCopy + "/" + e.Name(); !want[name] {
			extra = append(extra, name)
		}
	}
	return extra, nil
}
