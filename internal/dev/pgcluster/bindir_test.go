package pgcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeInstall makes root/N/bin with a server for each version, and
// root/13/bin with only a client (no server).
func fakeInstall(t *testing.T, versions ...int) string {
	t.Helper()
	root := t.TempDir()
	for _, v := range versions {
		dir := versionDir(root, v)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if err := os.WriteFile(filepath.Join(dir, b), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(versionDir(root, 13), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()

	t.Run("NewestAtLeastTheMinimum", func(t *testing.T) {
		t.Parallel()
		root := fakeInstall(t, 12, 15, 17, 16)
		got, err := findBinDir(root, "", 0)
		if err != nil || got != versionDir(root, 17) {
			t.Fatalf("got %q, %v; want %s", got, err, versionDir(root, 17))
		}
	})
	t.Run("TheExistingClustersVersion", func(t *testing.T) {
		t.Parallel()
		root := fakeInstall(t, 15, 17)
		got, err := findBinDir(root, "", 15)
		if err != nil || got != versionDir(root, 15) {
			t.Fatalf("got %q, %v; want %s", got, err, versionDir(root, 15))
		}
		_, err = findBinDir(root, "", 16)
		if err == nil || !strings.Contains(err.Error(), "made by PostgreSQL 16") || !strings.Contains(err.Error(), "apt-get install postgresql-16") {
			t.Fatalf("a cluster of an uninstalled version: %v", err)
		}
	})
	t.Run("PG_BIN_DIRWins", func(t *testing.T) {
		t.Parallel()
		root := fakeInstall(t, 14, 17)
		got, err := findBinDir(root, versionDir(root, 14), 0)
		if err != nil || got != versionDir(root, 14) {
			t.Fatalf("got %q, %v", got, err)
		}
		_, err = findBinDir(root, versionDir(root, 13), 0)
		if err == nil || !strings.Contains(err.Error(), "PG_BIN_DIR="+versionDir(root, 13)+" holds no PostgreSQL server") {
			t.Fatalf("PG_BIN_DIR without a server: %v", err)
		}
	})
	t.Run("NoneRecentEnoughSaysWhatToInstall", func(t *testing.T) {
		t.Parallel()
		root := fakeInstall(t, 12)
		_, err := findBinDir(root, "", 0)
		if err == nil || !strings.Contains(err.Error(), "no PostgreSQL 14 or newer") || !strings.Contains(err.Error(), "found only [12]") || !strings.Contains(err.Error(), "apt-get install postgresql") {
			t.Fatalf("got %v", err)
		}
		_, err = findBinDir(filepath.Join(root, "absent"), "", 0)
		if err == nil || !strings.Contains(err.Error(), "apt-get install postgresql") {
			t.Fatalf("nothing installed: %v", err)
		}
	})
}

// TestPgBinDirScriptAgrees: .ci/pg-bin-dir, which make deps and CI use, picks
// the directory FindBinDir picks, and fails where it fails.
func TestPgBinDirScriptAgrees(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs("../../../.ci/pg-bin-dir")
	if err != nil {
		t.Fatal(err)
	}
	for _, versions := range [][]int{{15}, {12, 15, 17, 16}, {14}, {12}, nil} {
		root := fakeInstall(t, versions...)
		want, wantErr := findBinDir(root, "", 0)
		cmd := exec.Command(script)
		cmd.Env = append(os.Environ(), "PG_INSTALL_ROOT="+root, "PG_BIN_DIR=")
		out, err := cmd.Output()
		got := strings.TrimSpace(string(out))
		if (err != nil) != (wantErr != nil) || (err == nil && got != want) {
			t.Errorf("versions %v: script gave %q (%v), FindBinDir %q (%v)", versions, got, err, want, wantErr)
		}
	}
}
