// Package image checks the container image without Docker: it builds the
// binary with the Dockerfile's own build command, lays out a root file
// system the way the Dockerfile's final stage does (the binary and the
// copied pipelines/ and mappings/, nothing else: no shell, no zoneinfo, no
// libc) and runs `forwarder lint` and `forwarder test` chrooted into it, as
// the image's user, with an empty environment. What passes here needs
// nothing from the base image. The rest of the Dockerfile (its parse, the
// chart's use of its paths) is checked in deploy/validate.
package image

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// imageUID is distroless's nonroot user, the image's USER.
const imageUID = 65532

func TestImageRunsLintAndTestFromAnEmptyRoot(t *testing.T) {
	root := testinputs.ModuleRoot(t)
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	final := df.stages[len(df.stages)-1]

	// The binary, built by the Dockerfile's RUN line itself, run by sh as
	// Docker would, with its output redirected into a temporary directory.
	build := df.buildCommand(t)
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}"} {
		if !strings.Contains(build.run, flag) {
			t.Errorf("the Dockerfile's go build line lacks %q: %s", flag, build.run)
		}
	}
	out := t.TempDir()
	bin := filepath.Join(out, "forwarder")
	cmd := exec.Command("/bin/sh", "-c", strings.Replace(build.run, "-o "+build.output, "-o "+bin, 1))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(runtime.GOROOT(), "bin")+":"+os.Getenv("PATH"))
	for k, v := range build.args {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "VERSION=image-test")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build command failed: %v\n%s", err, b)
	}

	// The root file system: exactly what the final stage copies.
	rootfs := t.TempDir()
	ignore := readDockerignore(t, filepath.Join(root, ".dockerignore"))
	for _, c := range final.copies {
		if len(c.srcs) != 1 {
			t.Fatalf("Dockerfile: COPY %q %s: this test handles one source per COPY in the final stage", c.srcs, c.dst)
		}
		src, dst := c.srcs[0], filepath.Join(rootfs, c.dst)
		switch c.from {
		case "":
			copyTree(t, root, src, dst, ignore)
		case build.stage:
			if src != build.output {
				t.Fatalf("the final stage copies %s from %s, but the build writes %s", src, c.from, build.output)
			}
			copyFile(t, bin, dst, 0o755)
		default:
			t.Fatalf("the final stage copies from stage %q, which this test does not know", c.from)
		}
	}
	chmodTree(t, rootfs)
	for _, absent := range []string{"bin/sh", "usr/share/zoneinfo", "etc/passwd", "lib"} {
		if _, err := os.Stat(filepath.Join(rootfs, absent)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the test root has /%s; it must hold only what the Dockerfile copies", absent)
		}
	}
	if final.user != "nonroot" && final.user != fmt.Sprint(imageUID) {
		t.Fatalf("USER is %q; this test runs as distroless's nonroot (%d)", final.user, imageUID)
	}
	if len(final.entrypoint) != 1 || len(final.cmd) != 2 || final.cmd[0] != "-c" {
		t.Fatalf("want ENTRYPOINT [binary] and CMD [-c, config]; got %q and %q", final.entrypoint, final.cmd)
	}

	for _, args := range [][]string{
		{"--version"},
		{"lint", final.cmd[1]},
		{"lint", "./pipelines/..."},
		{"test", "./pipelines/...", "./mappings/..."},
	} {
		out, err := runInRoot(t, rootfs, final.workdir, final.entrypoint[0], args...)
		if err != nil {
			t.Fatalf("forwarder %s in the image's root: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "--version" && !strings.Contains(out, "image-test") {
			t.Fatalf("--version does not show the version given at build (VERSION=image-test):\n%s", out)
		}
		t.Logf("forwarder %s: ok\n%s", strings.Join(args, " "), lastLines(out, 3))
	}
}

// runInRoot runs bin (a path inside rootfs) chrooted into rootfs, in dir,
// with an empty environment. As root it also drops to the image's user.
// Otherwise it needs an unprivileged user namespace to chroot, and fails
// the test saying so when it has none: a skip would pass CI without the
// proof.
func runInRoot(t *testing.T, rootfs, dir, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: imageUID, Gid: imageUID}
	} else {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("cannot chroot into the test root (%v): run this test as root (CI does), "+
			"or as a user allowed unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)", err)
	}
	return string(out), err
}

// dockerfile is what this test needs of the Dockerfile.
type dockerfile struct {
	stages []*stage
}

type stage struct {
	name       string
	args       map[string]string // ARG defaults, global ones included
	runs       []string
	copies     []copyInstr
	workdir    string
	user       string
	entrypoint []string
	cmd        []string
}

type copyInstr struct {
	from, dst string
	srcs      []string
}

type buildCmd struct {
	stage, run, output string
	args               map[string]string
}

// parseDockerfile reads the instructions this test acts on. The full parse
// (with BuildKit's parser) is deploy/validate's.
func parseDockerfile(t *testing.T, name string) *dockerfile {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df := &dockerfile{}
	global := map[string]string{}
	var cur *stage
	var line strings.Builder
	sc := bufio.NewScanner(f)
	flush := func() {
		instr := strings.TrimSpace(line.String())
		line.Reset()
		if instr == "" {
			return
		}
		keyword, rest, _ := strings.Cut(instr, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(keyword) {
		case "FROM":
			cur = &stage{args: map[string]string{}}
			for k, v := range global {
				cur.args[k] = v
			}
			if _, name, ok := strings.Cut(strings.ToLower(rest), " as "); ok {
				cur.name = strings.TrimSpace(name)
			}
			df.stages = append(df.stages, cur)
		case "ARG":
			k, v, _ := strings.Cut(rest, "=")
			if cur == nil {
				global[k] = v
			} else {
				cur.args[k] = v
			}
		case "RUN":
			cur.runs = append(cur.runs, rest)
		case "COPY":
			fields := strings.Fields(rest)
			c := copyInstr{}
			for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
				if v, ok := strings.CutPrefix(fields[0], "--from="); ok {
					c.from = v
				}
				fields = fields[1:]
			}
			if len(fields) >= 2 {
				c.srcs, c.dst = fields[:len(fields)-1], fields[len(fields)-1]
			}
			cur.copies = append(cur.copies, c)
		case "WORKDIR":
			cur.workdir = rest
		case "USER":
			cur.user = rest
		case "ENTRYPOINT":
			cur.entrypoint = jsonArray(t, keyword, rest)
		case "CMD":
			cur.cmd = jsonArray(t, keyword, rest)
		}
	}
	for sc.Scan() {
		text := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(text), "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(text, "\\"); ok {
			line.WriteString(cont + " ")
			continue
		}
		line.WriteString(text)
		flush()
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(df.stages) < 2 {
		t.Fatalf("Dockerfile: want a build stage and a runtime stage, found %d stages", len(df.stages))
	}
	return df
}

var outputFlag = regexp.MustCompile(`-o\s+(\S+)`)

// buildCommand is the RUN line that builds cmd/forwarder.
func (df *dockerfile) buildCommand(t *testing.T) buildCmd {
	t.Helper()
	var found []buildCmd
	for _, s := range df.stages {
		for _, run := range s.runs {
			if strings.Contains(run, "go build") && strings.Contains(run, "./cmd/forwarder") {
				m := outputFlag.FindStringSubmatch(run)
				if m == nil {
					t.Fatalf("Dockerfile: the go build line has no -o: %s", run)
				}
				found = append(found, buildCmd{stage: s.name, run: run, output: m[1], args: s.args})
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("Dockerfile: want exactly one RUN ... go build ... ./cmd/forwarder, found %d", len(found))
	}
	return found[0]
}

func jsonArray(t *testing.T, keyword, s string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("Dockerfile: %s %s: want the exec (JSON array) form, there is no shell in the image: %v", keyword, s, err)
	}
	return v
}

// readDockerignore returns a matcher for the simple patterns .dockerignore
// uses: a path or glob from the context root, or **/glob for any depth.
func readDockerignore(t *testing.T, name string) func(rel string) bool {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			t.Fatalf(".dockerignore: exceptions (%s) are not handled by this test", l)
		}
		patterns = append(patterns, strings.TrimSuffix(l, "/"))
	}
	return func(rel string) bool {
		for _, p := range patterns {
			if glob, ok := strings.CutPrefix(p, "**/"); ok {
				if m, _ := path.Match(glob, path.Base(rel)); m {
					return true
				}
				continue
			}
			if m, _ := path.Match(p, rel); m {
				return true
			}
			if strings.HasPrefix(rel, p+"/") {
				return true
			}
		}
		return false
	}
}

// copyTree copies src (relative to the build context) to dst like COPY
// does for a directory, leaving out what .dockerignore excludes.
func copyTree(t *testing.T, context, src, dst string, ignored func(string) bool) {
	t.Helper()
	src = strings.TrimSuffix(src, "/")
	err := filepath.WalkDir(filepath.Join(context, src), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(context, p)
		if ignored(filepath.ToSlash(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		inner, _ := filepath.Rel(filepath.Join(context, src), p)
		target := filepath.Join(dst, inner)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		copyFile(t, p, target, 0o644)
		return nil
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// chmodTree makes every directory of the root traversable by the image's
// user, as the image's are (t.TempDir creates 0700 directories).
func chmodTree(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o755)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
