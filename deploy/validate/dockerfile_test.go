package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"golang.org/x/mod/modfile"
)

// dockerfile is the repository's Dockerfile as BuildKit parses it.
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
	warnings []string
	final    finalStage
}

// finalStage is what the product image (the last stage) sets.
type finalStage struct {
	base        string
	user        string
	workdir     string
	entrypoint  []string
	cmd         []string
	expose      []string
	copyDests   []string // destinations, without trailing slashes
	healthcheck []string
}

// parseDockerfile parses the Dockerfile with BuildKit's parser and
// instruction decoder, running its linter, as `docker build --check` would.
func parseDockerfile(t testing.TB) *dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile does not parse: %v", err)
	}
	df := &dockerfile{}
	for _, w := range res.Warnings {
		df.warnings = append(df.warnings, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, _ []parser.Range) {
		df.warnings = append(df.warnings, rule+": "+msg)
	}})
	df.stages, df.metaArgs, err = instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("Dockerfile instructions: %v", err)
	}
	if len(df.stages) == 0 {
		t.Fatal("Dockerfile has no stage")
	}
	last := df.stages[len(df.stages)-1]
	df.final.base = last.BaseName
	for _, cmd := range last.Commands {
		switch c := cmd.(type) {
		case *instructions.UserCommand:
			df.final.user = c.User
		case *instructions.WorkdirCommand:
			df.final.workdir = c.Path
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("ENTRYPOINT in shell form: the image has no shell")
			}
			df.final.entrypoint = c.CmdLine
		case *instructions.CmdCommand:
			if c.PrependShell {
				t.Errorf("CMD in shell form: the image has no shell")
			}
			df.final.cmd = c.CmdLine
		case *instructions.ExposeCommand:
			df.final.expose = append(df.final.expose, c.Ports...)
		case *instructions.CopyCommand:
			df.final.copyDests = append(df.final.copyDests, strings.TrimSuffix(c.DestPath, "/"))
		case *instructions.HealthCheckCommand:
			df.final.healthcheck = c.Health.Test
		}
	}
	return df
}

// TestDockerfile: the image is static, non-root and holds what the chart
// and the compose stack expect, where they expect it.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	df := parseDockerfile(t)
	for _, w := range df.warnings {
		t.Errorf("BuildKit warns: %s", w)
	}
	f := df.final

	if f.base != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("the image is based on %q, want distroless/static (no shell, no libc, non-root)", f.base)
	}
	// distroless's nonroot user is 65532, the uid the chart runs as.
	if f.user != "nonroot" && f.user != "65532" && f.user != "65532:65532" {
		t.Errorf("USER %q, want distroless's nonroot (65532)", f.user)
	}
	if f.workdir != "/etc/forwarder" {
		t.Errorf("WORKDIR %q, want /etc/forwarder: the pipeline's mapping paths are relative to it", f.workdir)
	}
	if !slices.Equal(f.entrypoint, []string{"/usr/local/bin/forwarder"}) {
		t.Errorf("ENTRYPOINT %q", f.entrypoint)
	}
	if !slices.Equal(f.cmd, []string{"-c", pipelinesDir + "/forwarder.yaml"}) {
		t.Errorf("CMD %q, want the shipped pipeline", f.cmd)
	}
	if !slices.Equal(f.expose, []string{"4195"}) {
		t.Errorf("EXPOSE %q, want 4195 (HTTP_ADDR's default port)", f.expose)
	}
	for _, dir := range []string{pipelinesDir, mappingsDir, "/usr/local/bin/forwarder"} {
		if !slices.Contains(f.copyDests, dir) {
			t.Errorf("the image copies nothing to %s (copies: %v)", dir, f.copyDests)
		}
	}
	if !slices.Equal(f.healthcheck, []string{"CMD", "/usr/local/bin/forwarder", "healthcheck"}) {
		t.Errorf("HEALTHCHECK %q, want the exec form of `forwarder healthcheck`", f.healthcheck)
	}

	var builds []string
	for _, s := range df.stages {
		for _, cmd := range s.Commands {
			switch c := cmd.(type) {
			case *instructions.AddCommand:
				for _, src := range c.SourcePaths {
					if isRemote(src) {
						t.Errorf("stage %s: ADD %s fetches from the network at build time (unpinned, unverified)", s.Name, src)
					}
				}
			case *instructions.RunCommand:
				line := strings.Join(c.CmdLine, " ")
				if strings.Contains(line, "./cmd/forwarder") {
					builds = append(builds, line)
				}
				if regexp.MustCompile(`\b(curl|wget)\b`).MatchString(line) {
					t.Errorf("stage %s downloads during the build: %s", s.Name, line)
				}
			}
		}
	}
	if len(builds) != 1 {
		t.Fatalf("want one RUN building ./cmd/forwarder, found %d", len(builds))
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "-o /out/forwarder"} {
		if !strings.Contains(builds[0], flag) {
			t.Errorf("the build lacks %q: %s", flag, builds[0])
		}
	}

	// The builder's Go is the module's.
	mod, err := modfile.ParseLax("go.mod", []byte(readRepo(t, "go.mod")), nil)
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, a := range df.metaArgs {
		for _, kv := range a.Args {
			if kv.Key == "GO_VERSION" && kv.Value != nil {
				goVersion = *kv.Value
			}
		}
	}
	if goVersion != mod.Go.Version {
		t.Errorf("ARG GO_VERSION=%s, go.mod says go %s", goVersion, mod.Go.Version)
	}

	// The compose stack builds the devstack target.
	var devstack bool
	for _, s := range df.stages {
		devstack = devstack || s.Name == "devstack"
	}
	if !devstack {
		t.Error("no devstack stage for deploy/compose")
	}
}

func isRemote(src string) bool {
	for _, p := range []string{"http://", "https://", "git@", "git://", "ssh://"} {
		if strings.HasPrefix(src, p) {
			return true
		}
	}
	return false
}

// TestDockerignore: the build context holds what the build needs and not
// the repository's bulk or secrets-prone state.
func TestDockerignore(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	for path, wantExcluded := range map[string]bool{
		"go.mod": false, "go.sum": false, "cmd/forwarder/main.go": false, "cmd/devstack/main.go": false,
		"plugins/outbox/processor_outbox.go": false, "internal/outboxdb/sql/claim.sql": false,
		"pipelines/forwarder.yaml": false, "mappings/vehicle_event.blobl": false, "mappings/vehicle_event_test.yaml": false,
		".git/config": true, "bin/forwarder": true, ".data/pg/PG_VERSION": true, "deploy/helm/forwarder/Chart.yaml": true,
		"cmd/forwarder/main_test.go": true, "pipelines/pipelines_test.go": true,
	} {
		excluded, err := pm.MatchesOrParentMatches(path)
		if err != nil {
			t.Fatal(err)
		}
		if excluded != wantExcluded {
			t.Errorf(".dockerignore: %s excluded=%v, want %v", path, excluded, wantExcluded)
		}
	}
}
