package docs_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/streamdb"
)

// The figures and tables that several pages (and the chart) repeat are
// checked against their source here, so that they cannot drift apart.

func readRoot(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableRows are the rows of the Markdown tables in text, as cells without
// the outer pipes, header and separator rows included.
func tableRows(text string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	return rows
}

// section is the text of the Markdown section headed heading, up to the
// next heading of the same or a higher level.
func section(t *testing.T, text, heading string) string {
	t.Helper()
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no section %q", heading)
	}
	rest := text[i+len(heading)+2:]
	level := strings.Count(strings.Fields(heading)[0], "#")
	next := regexp.MustCompile(`(?m)^#{1,` + strconv.Itoa(level) + `} `).FindStringIndex(rest)
	if next != nil {
		rest = rest[:next[0]]
	}
	return rest
}

// TestAlertTableMatchesTheRules: docs/deployment.md's alert table lists
// exactly the alerts of deploy/prometheus/alerts.yml, each with its
// severity.
func TestAlertTableMatchesTheRules(t *testing.T) {
	t.Parallel()
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(readRoot(t, "deploy/prometheus/alerts.yml")), &file); err != nil {
		t.Fatal(err)
	}
	rules := map[string]string{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				rules[r.Alert] = r.Labels["severity"]
			}
		}
	}
	if len(rules) < 5 {
		t.Fatalf("found only %v in alerts.yml: the scan is broken", rules)
	}
	documented := map[string]string{}
	for _, row := range tableRows(section(t, readRoot(t, "docs/deployment.md"), "### Alerts to wire")) {
		if len(row) >= 2 && strings.HasPrefix(row[0], "`Forwarder") {
			documented[strings.Trim(row[0], "`")] = row[1]
		}
	}
	for name, sev := range rules {
		switch got, ok := documented[name]; {
		case !ok:
			t.Errorf("docs/deployment.md's alert table lacks %s (severity %s)", name, sev)
		case got != sev:
			t.Errorf("docs/deployment.md gives %s severity %s; alerts.yml says %s", name, got, sev)
		}
	}
	for name := range documented {
		if _, ok := rules[name]; !ok {
			t.Errorf("docs/deployment.md lists %s, which alerts.yml does not define", name)
		}
	}
}

// pipelineDefaults are the `${NAME:default}` defaults of the shipped
// pipelines, by variable: one default each, or the test fails.
func pipelineDefaults(t *testing.T) map[string]string {
	t.Helper()
	ref := regexp.MustCompile(`\$\{([A-Z0-9_]+):([^}]*)\}`)
	defaults := map[string]string{}
	where := map[string]string{}
	err := filepath.WalkDir(filepath.Join(root, "pipelines"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, "_benthos_test.yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			if prev, ok := defaults[m[1]]; ok && prev != m[2] {
				t.Errorf("%s defaults to %q in %s and %q in %s: the docs can give one default only", m[1], prev, where[m[1]], m[2], p)
			}
			defaults[m[1]], where[m[1]] = m[2], p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defaults) < 20 {
		t.Fatalf("found only %v in pipelines/: the scan is broken", defaults)
	}
	return defaults
}

// TestVariableDefaultsMatchThePipelines: the default docs/configuration.md
// gives each variable is the one its pipeline writes (`${NAME:default}`),
// both ways: every variable with a default in a pipeline has a row with
// that default, and no row gives another. An empty default reads "empty"
// or "none" in the docs. DATABASE_URL's default is the plugins' own.
func TestVariableDefaultsMatchThePipelines(t *testing.T) {
	t.Parallel()
	want := pipelineDefaults(t)
	want["DATABASE_URL"] = streamdb.DefaultDSN
	documented := map[string]string{}
	name := regexp.MustCompile("^`([A-Z0-9_]+)`$")
	for _, row := range tableRows(readRoot(t, "docs/configuration.md")) {
		if len(row) < 2 {
			continue
		}
		for _, cell := range strings.Split(row[0], ", ") {
			if m := name.FindStringSubmatch(cell); m != nil {
				if _, dup := documented[m[1]]; !dup {
					documented[m[1]] = row[1]
				}
			}
		}
	}
	for v, def := range want {
		doc, ok := documented[v]
		switch {
		case !ok:
			t.Errorf("docs/configuration.md has no row for %s (default %q in the pipeline)", v, def)
		case def == "" && !strings.HasPrefix(doc, "empty") && doc != "none":
			t.Errorf("docs/configuration.md gives %s the default %s; the pipeline leaves it empty", v, doc)
		case def != "" && doc != "`"+def+"`":
			t.Errorf("docs/configuration.md gives %s the default %s; the pipeline's is `%s`", v, doc, def)
		}
	}
}

// TestConnectionsPerInstance: every page that counts an instance's
// PostgreSQL connections gives the same number, the one the code opens:
// the stream's pool (streamdb.DefaultMaxConns), the LISTEN connection and
// the metrics exporter's (test/e2e TestThreeInstancesShortLease holds
// three instances to it).
func TestConnectionsPerInstance(t *testing.T) {
	t.Parallel()
	total := streamdb.DefaultMaxConns + 2
	counts := regexp.MustCompile(`(?i)at most (\d+) per instance|connections per instance: at most (\d+)|instance holds at most (\d+)|instances × (\d+)`)
	pools := regexp.MustCompile(`pool of (\d+)`)
	found := 0
	for page, text := range docPages(t) {
		text = strings.ReplaceAll(text, "\n", " ")
		for _, m := range counts.FindAllStringSubmatch(text, -1) {
			found++
			for _, n := range m[1:] {
				if n != "" && n != strconv.Itoa(int(total)) {
					t.Errorf("%s: %q: an instance opens at most %d connections (a pool of %d, LISTEN, the metrics exporter)", page, m[0], total, streamdb.DefaultMaxConns)
				}
			}
		}
		for _, m := range pools.FindAllStringSubmatch(text, -1) {
			if m[1] != strconv.Itoa(int(streamdb.DefaultMaxConns)) {
				t.Errorf("%s: %q: the stream's pool holds %d", page, m[0], streamdb.DefaultMaxConns)
			}
		}
	}
	if found < 4 {
		t.Fatalf("found %d statements of the connections per instance: the scan is broken (README, configuration.md and deployment.md state it)", found)
	}
}

// TestMemoryFigureAgrees: the resident size with ordinary messages is
// stated alike wherever it is (README, docs, the chart's values).
func TestMemoryFigureAgrees(t *testing.T) {
	t.Parallel()
	texts := docPages(t)
	texts["deploy/helm/forwarder/values.yaml"] = readRoot(t, "deploy/helm/forwarder/values.yaml")
	near := regexp.MustCompile(`near (\d+) MiB`)
	seen := map[string][]string{}
	for page, text := range texts {
		for _, m := range near.FindAllStringSubmatch(strings.ReplaceAll(text, "\n# ", " "), -1) {
			seen[m[1]] = append(seen[m[1]], page)
		}
	}
	if len(seen) != 1 {
		t.Errorf("the resident size with ordinary messages is given as %v: one figure, please", seen)
	}
	for _, page := range []string{"README.md", "docs/configuration.md", "docs/deployment.md"} {
		ok := false
		for _, pages := range seen {
			ok = ok || slices.Contains(pages, page)
		}
		if !ok {
			t.Errorf("%s no longer states the resident size (\"near N MiB\"): the scan is broken", page)
		}
	}
}

// TestDocumentedSetWorks: the `--set` that docs/configuration.md advises
// (and gives the chart through extraArgs) names a field of the shipped
// pipeline: the forwarder applies it, and the result still passes lint.
func TestDocumentedSetWorks(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile("`--set ([a-z0-9_.]+)=([^`]+)`").FindStringSubmatch(readRoot(t, "docs/configuration.md"))
	if m == nil {
		t.Fatal("docs/configuration.md advises no --set: the scan is broken")
	}
	field, value := m[1], m[2]
	out, err := exec.Command(forwarderBin, "-c", filepath.Join(root, "pipelines/forwarder.yaml"), "--set", field+"="+value, "echo").Output()
	if err != nil {
		t.Fatalf("forwarder -c pipelines/forwarder.yaml --set %s=%s echo: %v", field, value, err)
	}
	var conf any
	if err := yaml.Unmarshal(out, &conf); err != nil {
		t.Fatal(err)
	}
	node := conf
	for _, part := range strings.Split(field, ".") {
		switch n := node.(type) {
		case map[string]any:
			node = n[part]
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i >= len(n) {
				t.Fatalf("--set %s: %s is not an index of a list of %d", field, part, len(n))
			}
			node = n[i]
		default:
			t.Fatalf("--set %s: nothing at %s", field, part)
		}
	}
	if fmt.Sprint(node) != value {
		t.Fatalf("--set %s=%s: the field holds %v", field, value, node)
	}
	// The echoed config is a pipeline of its own: lint it from the root,
	// where its mapping paths resolve.
	file := filepath.Join(t.TempDir(), "set.yaml")
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	lint := exec.Command(forwarderBin, "lint", file)
	lint.Dir = root
	if b, err := lint.CombinedOutput(); err != nil {
		t.Errorf("the pipeline with --set %s=%s does not lint: %v\n%s", field, value, err, b)
	}
}

// TestExamplePlateIsInTheDevData: the plate the README and the operations
// page look up is one the dev stack's generator sends.
func TestExamplePlateIsInTheDevData(t *testing.T) {
	t.Parallel()
	plates := regexp.MustCompile(`--plate (\S+)`)
	for _, page := range []string{"README.md", "docs/operations.md"} {
		text := readRoot(t, page)
		if !strings.Contains(text, eventgen.ExamplePlate) {
			t.Errorf("%s does not look up %s, the plate the dev stack sends", page, eventgen.ExamplePlate)
		}
		if page == "README.md" {
			for _, m := range plates.FindAllStringSubmatch(text, -1) {
				if strings.Trim(m[1], "`") != eventgen.ExamplePlate {
					t.Errorf("README.md looks up plate %s; the dev stack sends %s", m[1], eventgen.ExamplePlate)
				}
			}
		}
	}
}

// TestMakeHelpNamesEveryPackage: `make help` names every Debian package
// `make deps` installs (APT_PACKAGES).
func TestMakeHelpNamesEveryPackage(t *testing.T) {
	t.Parallel()
	makefile := readRoot(t, "Makefile")
	m := regexp.MustCompile(`(?m)^APT_PACKAGES\s*:=\s*(.+)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatal("no APT_PACKAGES in the Makefile: the scan is broken")
	}
	help := regexp.MustCompile(`(?m)^deps:.*## (.+)$`).FindStringSubmatch(makefile)
	if help == nil {
		t.Fatal("no help text on the deps target")
	}
	for _, pkg := range strings.Fields(m[1]) {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(pkg) + `\b`).MatchString(help[1]) {
			t.Errorf("make help does not name %s, which make deps installs: %q", pkg, help[1])
		}
	}
}

// codeSpan is a Markdown code span's content.
var codeSpan = regexp.MustCompile("`([^`]+)`")

// TestRepositoryLayoutIsComplete: docs/architecture.md's repository layout
// names only paths that exist, and every directory with Go code, every
// top-level directory and every directory of deploy/ has a row (a path
// ending in / covers what is below it; a top-level directory is covered by
// a row of something in it); its internal/outboxcli row names every
// `forwarder outbox` command.
func TestRepositoryLayoutIsComplete(t *testing.T) {
	t.Parallel()
	var listed []string
	var outboxcliRow string
	for _, row := range tableRows(section(t, readRoot(t, "docs/architecture.md"), "## Repository layout"))[2:] {
		for _, m := range codeSpan.FindAllStringSubmatch(row[0], -1) {
			if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
				t.Errorf("the layout lists %s: %v", m[1], err)
			}
			listed = append(listed, m[1])
			if m[1] == "internal/outboxcli" {
				outboxcliRow = row[1]
			}
		}
	}
	if len(listed) < 20 {
		t.Fatalf("found only %v in the layout: the scan is broken", listed)
	}
	covered := func(dir string) bool {
		for _, p := range listed {
			if p == dir || strings.HasSuffix(p, "/") && strings.HasPrefix(dir+"/", p) {
				return true
			}
		}
		return false
	}

	want := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if d.IsDir() && rel != "." && (strings.HasPrefix(name, ".") && name != ".ci" || name == "testdata" || name == "bin" || name == "node_modules") {
			return fs.SkipDir
		}
		switch {
		case !d.IsDir() && strings.HasSuffix(name, ".go"):
			want[filepath.ToSlash(filepath.Dir(rel))] = "has Go code"
		case d.IsDir() && strings.HasPrefix(rel, "deploy/") && strings.Count(rel, "/") == 1:
			want[rel] = "a directory of deploy/"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, why := range want {
		if !covered(dir) {
			t.Errorf("the repository layout in docs/architecture.md has no row for %s (%s)", dir, why)
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") && e.Name() != ".ci" || e.Name() == "bin" {
			continue
		}
		if !slices.ContainsFunc(listed, func(p string) bool { return p == e.Name()+"/" || strings.HasPrefix(p, e.Name()+"/") }) {
			t.Errorf("the repository layout in docs/architecture.md names nothing in the top-level directory %s", e.Name())
		}
	}

	commands := 0
	for path := range cliModel(t) {
		parts := strings.Split(path, "_")
		if len(parts) != 3 || parts[1] != "outbox" || parts[2] == "help" {
			continue
		}
		commands++
		if !strings.Contains(outboxcliRow, "`"+parts[2]+"`") {
			t.Errorf("the layout's internal/outboxcli row does not name the command `forwarder outbox %s`", parts[2])
		}
	}
	if commands < 5 {
		t.Fatalf("found only %d forwarder outbox commands: the scan is broken", commands)
	}
}

// citation is a comment's reference to a part of a page by its words:
// docs/architecture.md, "Ordering" (comment markers between the lines of
// a wrapped one are dropped first).
var (
	citation         = regexp.MustCompile(`docs/([a-z]+\.md),? "([^"]+)"`)
	commentLineBreak = regexp.MustCompile(`\n\s*(?://|--|#)\s*`)
	// sectionNumber is a comment line citing a section by its number (§ and
	// digits): the spec those numbers belong to is not in the repository.
	sectionNumber = regexp.MustCompile(`(?m)^\s*(?://|--|#).*§\d`)
)

// TestCitationsNameTheirPage: every code comment that cites a part of a
// page by its words (docs/architecture.md, "Retention") cites a page that
// has those words, so that a section moved to another page does not leave
// comments pointing at the old one; and no comment cites a section by its
// number (§ and digits), which points at nothing a reader of the
// repository has.
func TestCitationsNameTheirPage(t *testing.T) {
	t.Parallel()
	pages := map[string]string{}
	found := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") && n != ".ci" || n == "bin" || n == "testdata" || n == "node_modules") {
				return fs.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".sql", ".yaml", ".yml", ".blobl":
		default:
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if m := sectionNumber.FindString(string(b)); m != "" {
			t.Errorf("%s cites a section by number: %q; cite the page and its words instead", p, strings.TrimSpace(m))
		}
		text := commentLineBreak.ReplaceAllString(string(b), " ")
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			page, ok := pages[m[1]]
			if !ok {
				pb, err := os.ReadFile(filepath.Join(root, "docs", m[1]))
				if err != nil {
					t.Errorf("%s cites docs/%s: %v", p, m[1], err)
					continue
				}
				page = strings.ToLower(strings.Join(strings.Fields(string(pb)), " "))
				pages[m[1]] = page
			}
			found++
			if words := strings.ToLower(strings.Join(strings.Fields(m[2]), " ")); !strings.Contains(page, words) {
				t.Errorf("%s cites docs/%s, %q: the page has no such words (moved to another page?)", p, m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("found only %d citations: the scan is broken", found)
	}
}

var (
	// mdLink is a Markdown link's target: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// mdFence is a fenced code block, whose text is not Markdown.
	mdFence   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	// mdHeadingLink is a link inside a heading: its text is what the anchor reads.
	mdHeadingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// text: lower case, every character but letters, digits, '_', '-' and
// spaces dropped, spaces made '-', a repeated anchor numbered -1, -2, ...
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(mdHeadingLink.ReplaceAllString(strings.TrimSpace(m[1]), "$1")) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		anchor := b.String()
		if n, ok := seen[anchor]; ok {
			seen[anchor] = n + 1
			anchor += "-" + strconv.Itoa(n+1)
		} else {
			seen[anchor] = 0
		}
		anchors[anchor] = true
	}
	return anchors
}

// TestLinksResolve: every link of a Markdown file of the repository to
// another file of it names a file that exists and, when it names a part of
// a page (page.md#part), a heading that page has; so that a renamed heading
// or a moved page does not leave links pointing at nothing.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "-C", root, "ls-files", "*.md").Output()
	if err != nil {
		t.Fatalf("listing the repository's pages (git ls-files): %v", err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) (map[string]bool, error) {
		if a, ok := anchors[page]; ok {
			return a, nil
		}
		b, err := os.ReadFile(page)
		if err != nil {
			return nil, err
		}
		anchors[page] = headingAnchors(string(b))
		return anchors[page], nil
	}
	links := 0
	for _, rel := range strings.Fields(string(out)) {
		page := filepath.Join(root, rel)
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(mdFence.ReplaceAllString(string(b), ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.Join(filepath.Dir(page), file)
			}
			links++
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s links to %s: no such file", rel, target)
				continue
			}
			if anchor == "" || filepath.Ext(dest) != ".md" {
				continue
			}
			a, err := anchorsOf(dest)
			if err != nil {
				t.Errorf("%s links to %s: %v", rel, target, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s links to %s: that page has no heading with the anchor %q", rel, target, anchor)
			}
		}
	}
	if links < 50 {
		t.Fatalf("found only %d links between the repository's pages: the scan is broken", links)
	}
}
