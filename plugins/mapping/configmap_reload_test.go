package mapping

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// configMapDir is a directory laid out the way the kubelet projects a
// ConfigMap volume (k8s.io/kubernetes pkg/volume/util AtomicWriter): the
// files live in a timestamped directory, `..data` links to it, and each
// key is a link through `..data`:
//
//	..2026_03_01_10_00_00.123456789/vehicle_event.blobl
//	..data -> ..2026_03_01_10_00_00.123456789
//	vehicle_event.blobl -> ..data/vehicle_event.blobl
//
// An update writes a new timestamped directory, points a new link at it,
// renames that link over `..data` (the one atomic step) and removes the
// old directory. The Helm chart mounts pipelines and mappings this way
// (never with subPath, which the kubelet does not update).
type configMapDir struct {
	dir     string
	current string // the timestamped directory ..data points to
}

func newConfigMapDir(t *testing.T, files map[string]string) *configMapDir {
	t.Helper()
	cm := &configMapDir{dir: t.TempDir()}
	cm.current = cm.writeVersion(t, files)
	if err := os.Symlink(cm.current, filepath.Join(cm.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(cm.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return cm
}

// writeVersion writes files into a new timestamped directory and returns
// its name, relative to cm.dir.
func (cm *configMapDir) writeVersion(t *testing.T, files map[string]string) string {
	t.Helper()
	ts, err := os.MkdirTemp(cm.dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Base(ts)
}

// update swaps in a new version of every file, as the kubelet does after
// `kubectl edit configmap` or `helm upgrade` (same keys).
func (cm *configMapDir) update(t *testing.T, files map[string]string) {
	t.Helper()
	next := cm.writeVersion(t, files)
	tmp := filepath.Join(cm.dir, "..data_tmp")
	if err := os.Symlink(next, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(cm.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(cm.dir, cm.current)); err != nil {
		t.Fatal(err)
	}
	cm.current = next
}

// TestMappingFileConfigMapUpdate: an update of the ConfigMap that holds the
// mappings reaches a running mapping_file processor within a few seconds
// (docs/deployment.md), through the `..data` swap, for the mapping file and
// for a file it imports; a broken update is rejected and the previous
// mapping keeps serving.
func TestMappingFileConfigMapUpdate(t *testing.T) {
	t.Parallel()
	const main = "import \"./common.blobl\"\nroot.v = this.apply(\"v\")\nroot.w = \"one\"\n"
	cm := newConfigMapDir(t, map[string]string{
		"vehicle_event.blobl": main,
		"common.blobl":        "map v {\n  root = \"one\"\n}\n",
	})
	// pipelines/forwarder.yaml's reload_interval.
	tb := setupAt(t, cm.dir, filepath.Join(cm.dir, "vehicle_event.blobl"), "2s")
	if got := body(t, tb.mapOne(`{}`)); got != `{"v":"one","w":"one"}` {
		t.Fatalf("before the update: got %s", got)
	}

	// The bound is the promise itself: an edit takes effect within a few
	// seconds. The kubelet's own sync delay comes on top (docs/deployment.md).
	const promise = 5 * time.Second
	applied := func(what string, files map[string]string, want string) {
		t.Helper()
		cm.update(t, files)
		start := time.Now()
		eventually(t, what+" serves", func() bool {
			return body(t, tb.mapOne(`{}`)) == want
		})
		if took := time.Since(start); took > promise {
			t.Fatalf("%s took %v to apply, more than %v", what, took, promise)
		}
	}
	applied("an update of the mapping file", map[string]string{
		"vehicle_event.blobl": "import \"./common.blobl\"\nroot.v = this.apply(\"v\")\nroot.w = \"two\"\n",
		"common.blobl":        "map v {\n  root = \"one\"\n}\n",
	}, `{"v":"one","w":"two"}`)
	applied("an update of an imported file only", map[string]string{
		"vehicle_event.blobl": "import \"./common.blobl\"\nroot.v = this.apply(\"v\")\nroot.w = \"two\"\n",
		"common.blobl":        "map v {\n  root = \"three\"\n}\n",
	}, `{"v":"three","w":"two"}`)

	cm.update(t, map[string]string{
		"vehicle_event.blobl": "import \"./common.blobl\"\nroot.v = this.apply(\"v\")\nroot.w = this.nope()\n",
		"common.blobl":        "map v {\n  root = \"three\"\n}\n",
	})
	eventually(t, "the broken update is rejected", func() bool {
		return tb.capture.counter(metricReloads, map[string]string{"result": "error"}) == 1
	})
	if got := body(t, tb.mapOne(`{}`)); got != `{"v":"three","w":"two"}` {
		t.Fatalf("after a broken update: got %s, want the previous mapping's output", got)
	}
}
