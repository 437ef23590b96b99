package pgcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MinVersion is the oldest PostgreSQL major version the forwarder is tested
// with (the schema uses nothing newer).
const MinVersion = 14

// InstallRoot is where Debian's postgresql-N packages put their binaries:
// InstallRoot/N/bin.
const InstallRoot = "/usr/lib/postgresql"

// FindBinDir is the PostgreSQL binary directory to use: $PG_BIN_DIR when
// set, else the newest installed version ≥ MinVersion under InstallRoot.
// When dataDir already holds a cluster, the version that made it is needed
// (a server cannot open another major version's data directory), so that
// one is looked for instead. The error says what to install.
func FindBinDir(dataDir string) (string, error) {
	return findBinDir(InstallRoot, os.Getenv("PG_BIN_DIR"), clusterVersion(dataDir))
}

func findBinDir(root, envDir string, want int) (string, error) {
	if envDir != "" {
		if !hasServer(envDir) {
			return "", fmt.Errorf("PG_BIN_DIR=%s holds no PostgreSQL server (initdb, pg_ctl and postgres): point it at one, e.g. %s/16/bin, or unset it to use the newest installed", envDir, root)
		}
		return envDir, nil
	}
	installed := installedVersions(root)
	if want != 0 {
		if slices.Contains(installed, want) {
			return versionDir(root, want), nil
		}
		return "", fmt.Errorf("the existing cluster was made by PostgreSQL %d, which is not installed under %s: install it (sudo apt-get install postgresql-%d), point PG_BIN_DIR at its bin directory, or remove the cluster (make clean) to start over with %s", want, root, want, newestOr(installed, "a newer one"))
	}
	for i := len(installed) - 1; i >= 0; i-- {
		if installed[i] >= MinVersion {
			return versionDir(root, installed[i]), nil
		}
	}
	found := ""
	if len(installed) > 0 {
		found = fmt.Sprintf(" (found only %v, older than %d)", installed, MinVersion)
	}
	return "", fmt.Errorf("no PostgreSQL %d or newer under %s%s: install one (sudo apt-get install postgresql; Debian 12 gives 15) or set PG_BIN_DIR to a directory holding initdb, pg_ctl and postgres", MinVersion, root, found)
}

// installedVersions are the major versions under root with a server, oldest
// first.
func installedVersions(root string) []int {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var vs []int
	for _, e := range entries {
		v, err := strconv.Atoi(e.Name())
		if err == nil && hasServer(versionDir(root, v)) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return vs
}

func versionDir(root string, v int) string { return filepath.Join(root, strconv.Itoa(v), "bin") }

func hasServer(dir string) bool {
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

// clusterVersion is the major version of the cluster in dir, 0 when there
// is none.
func clusterVersion(dir string) int {
	if dir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "PG_VERSION"))
	if err != nil {
		return 0
	}
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

func newestOr(vs []int, none string) string {
	if len(vs) == 0 {
		return none
	}
	return strconv.Itoa(vs[len(vs)-1])
}
