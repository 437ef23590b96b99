package docs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/envcheck"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The repository root, from docs/.
const root = ".."

var forwarderBin string

func TestMain(m *testing.M) {
	// $FORWARDER_BIN is the binary `make test` built; otherwise build one.
	forwarderBin = os.Getenv("FORWARDER_BIN")
	if forwarderBin == "" {
		dir, err := os.MkdirTemp("", "docs-forwarder-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		forwarderBin = filepath.Join(dir, "forwarder")
		cmd := exec.Command("go", "build", "-o", forwarderBin, "./cmd/forwarder")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			panic("building forwarder: " + err.Error() + "\n" + string(out))
		}
	}
	pgtest.Main(m)
}

// docPages are the pages the checks read: the README and every page under
// docs/ (the generated reference included).
func docPages(t *testing.T) map[string]string {
	t.Helper()
	pages := map[string]string{}
	add := func(p string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		pages[rel] = string(b)
	}
	add(filepath.Join(root, "README.md"))
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			add(p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// TestConfigurationDocumentsEveryVariable: every environment variable a
// shipped pipeline uses, every one the plugins read themselves, and every
// one the start-up checks know, is in docs/configuration.md.
func TestConfigurationDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	conf, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"DATABASE_URL":         "read by the outbox plugins",
		"PLATFORM_ACCESS_NAME": "read by http_forwarder",
		"PLATFORM_ACCESS_PWD":  "read by http_forwarder",
	}
	ref := regexp.MustCompile(`\$\{([0-9A-Za-z_.]+)`)
	err = filepath.WalkDir(filepath.Join(root, "pipelines"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			want[m[1]] = "used by " + p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 10 {
		t.Fatalf("found only %v in pipelines/: the scan is broken", want)
	}
	for _, v := range envcheck.Vars {
		if _, ok := want[v.Name]; !ok {
			want[v.Name] = "checked by internal/envcheck"
		}
	}
	for name, why := range want {
		if !strings.Contains(string(conf), "`"+name+"`") {
			t.Errorf("docs/configuration.md does not document %s (%s)", name, why)
		}
	}
}

// notMetrics are forwarder_* names in the docs that are not metrics.
var notMetrics = map[string]string{
	"forwarder_outbox":            "the NOTIFY channel",
	"forwarder_schema_migrations": "the migrations table",
	"forwarder_schema_steps":      "the migration steps table",
	"forwarder_owner":             "a database role (docs/deployment.md, Roles and grants)",
	"forwarder_service":           "a database role",
	"forwarder_console":           "a database role",
}

// eventOnly are documented metrics that have no series until their first
// event, because their labels' values are only known then; each should be
// pre-created at 0 by the plugin that owns it, and removed from here.
var eventOnly = map[string]string{
	// Partitions are only known once assigned; a fresh group has none.
	"forwarder_kafka_consumer_lag": "plugins/kafka (topic × partition)",
}

// documentedMetrics are the forwarder_* names the pages write in code
// spans (`forwarder_x` or `forwarder_x{labels}`), with a page each.
func documentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	span := regexp.MustCompile("`(forwarder_[a-z0-9_]+)[`{]")
	names := map[string]string{}
	for page, text := range docPages(t) {
		for _, m := range span.FindAllStringSubmatch(text, -1) {
			if _, skip := notMetrics[m[1]]; !skip {
				names[m[1]] = page
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in the docs: the scan is broken", names)
	}
	return names
}

// metricsTable are the metrics docs/components.md's metrics table has a
// row for.
func metricsTable(t *testing.T) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(root, "docs", "components.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(text), "\n## Metrics")
	if !ok {
		t.Fatal("docs/components.md has no Metrics section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	names := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `forwarder_") {
			continue
		}
		for _, m := range regexp.MustCompile("`(forwarder_[a-z0-9_]+)`").FindAllStringSubmatch(first, -1) {
			names[m[1]] = true
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %v in the metrics table: the scan is broken", names)
	}
	return names
}

// scrape returns the metric family names /metrics serves.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	names := map[string]bool{}
	for n, f := range families {
		if len(f.GetMetric()) > 0 {
			names[n] = true
		}
	}
	return names
}

func missing(documented map[string]string, served map[string]bool) []string {
	var out []string
	for n := range documented {
		if !served[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// TestDocumentedMetricsExist runs the service on the shipped pipeline
// against an in-process Kafka, a fresh database and the mock platform, and
// checks that every metric the docs name is served: at start, all but the
// known event-only ones (eventOnly); once a few messages went through (a
// vehicle event, a heartbeat, one without messageId, one that fails its
// mapping), all of them. The other way, every forwarder_* metric served
// then has a row in docs/components.md's metrics table.
func TestDocumentedMetricsExist(t *testing.T) {
	t.Parallel()
	documented := documentedMetrics(t)

	kafka := kafkatest.New(t, []kafkatest.Topic{{Name: "device-vehicle-event", Partitions: 3}, {Name: "device-heartbeat", Partitions: 3}})
	platform, err := mockplatform.Start(mockplatform.Config{AccessName: "docs", AccessPwd: "docs-pwd"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = platform.Close() })
	addr, err := childproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "forwarder.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	proc, err := childproc.Start(childproc.Spec{
		Path: forwarderBin, Args: []string{"-c", "pipelines/forwarder.yaml"}, Dir: root,
		Environ: os.Environ(),
		Env: map[string]string{
			"KAFKA_BROKERS": kafka.Brokers(), "DATABASE_URL": pgtest.NewEmptyDB(t), "PLATFORM_URL": platform.URL,
			"PLATFORM_ACCESS_NAME": "docs", "PLATFORM_ACCESS_PWD": "docs-pwd", "HTTP_ADDR": addr,
		},
		Output: logFile, ParentDeath: syscall.SIGKILL,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = proc.Stop(30 * time.Second) }()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := proc.WaitPing(ctx, addr); err != nil {
		t.Fatalf("forwarder: %v\n%s", err, childproc.TailFile(logPath, 3000))
	}
	metricsURL := "http://" + addr + "/metrics"

	// At start: the record gauges come with the first refresh.
	var served map[string]bool
	for {
		served = scrape(t, metricsURL)
		if served["forwarder_outbox_gauges_last_refresh_timestamp_seconds"] || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range missing(documented, served) {
		if owner, known := eventOnly[n]; known {
			t.Logf("%s is not exported until its first event (owner: %s)", n, owner)
			continue
		}
		t.Errorf("%s (named in %s) is not served at start: metrics with known label values are pre-created at 0", n, documented[n])
	}

	vehicle := `{"messageId":"%s","deviceId":"CAM-1","parkCode":"P1","berthCode":"B1","plateNo":"A1","inoutType":%d,"inoutTime":1779330600000,"plateCredible":0.5,"pictures":[]}`
	kafka.Produce(t,
		&kgo.Record{Topic: "device-vehicle-event", Value: fmt.Appendf(nil, vehicle, "docs-1", 1)},
		&kgo.Record{Topic: "device-vehicle-event", Value: fmt.Appendf(nil, vehicle, "docs-2", 7)}, // a mapping error
		&kgo.Record{Topic: "device-vehicle-event", Value: []byte(`{"deviceId":"CAM-1","parkCode":"P1","berthCode":"B1","plateNo":"A1","inoutType":0,"inoutTime":1779330600000}`)},
		&kgo.Record{Topic: "device-heartbeat", Value: []byte(`{"messageId":"docs-3","deviceId":"CAM-1","parkCode":"P1","berthCode":"B1","captureTime":1779330900000,"picType":3,"picUrl":"a.jpg"}`)},
	)
	for {
		served = scrape(t, metricsURL)
		gone := missing(documented, served)
		if len(gone) == 0 {
			table := metricsTable(t)
			for n := range served {
				if strings.HasPrefix(n, "forwarder_") && !table[n] {
					t.Errorf("%s is served but has no row in docs/components.md's metrics table", n)
				}
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("metrics named in the docs but not served after messages went through: %v\n%s", gone, childproc.TailFile(logPath, 3000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cliModel is the binary's command tree, from its hidden
// --help-autocomplete: each command path ("forwarder_outbox_stats") with
// its flags.
func cliModel(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command(forwarderBin, "--help-autocomplete").Output()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []struct {
		Path string   `json:"path"`
		Args []string `json:"args"`
	}
	if err := json.Unmarshal(out, &cmds); err != nil {
		t.Fatal(err)
	}
	model := map[string][]string{}
	for _, c := range cmds {
		model[c.Path] = append(slices.Clone(c.Args), "--help", "-h")
	}
	return model
}

// helpFlag is a flag's line in a command's --help: its names, each followed
// by " value" when the flag takes one ("--key value [ --key value ]",
// "--resources value, -r value", "--dry-run", "--help, -h").
var helpFlag = regexp.MustCompile(`^\s+(-{1,2}[A-Za-z0-9][\w.-]*(?: value)?(?:, -{1,2}[A-Za-z0-9][\w.-]*(?: value)?)*)(?:\s|$)`)

// flagValues runs `<command> --help` for each command path of model (each
// must succeed) and says, for each of its flags, whether the flag takes a
// value, as the help shows it. The root command hides its flags from its
// help: they are run's (the same definitions) plus --config (-c), a path.
func flagValues(t *testing.T, model map[string][]string) map[string]map[string]bool {
	t.Helper()
	helps := map[string][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for path := range model {
		wg.Go(func() {
			args := append(strings.Split(path, "_")[1:], "--help")
			help, err := exec.Command(forwarderBin, args...).CombinedOutput()
			if err != nil {
				t.Errorf("forwarder %s: %v\n%s", strings.Join(args, " "), err, help)
			}
			mu.Lock()
			helps[path] = help
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	out := map[string]map[string]bool{}
	for path, help := range helps {
		takes := map[string]bool{}
		for _, line := range strings.Split(string(help), "\n") {
			m := helpFlag.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			for _, alt := range strings.Split(m[1], ", ") {
				name, value := strings.CutSuffix(alt, " value")
				takes[name] = value
			}
		}
		out[path] = takes
	}
	root := out["forwarder"]
	for f, v := range out["forwarder_run"] {
		if _, ok := root[f]; !ok {
			root[f] = v
		}
	}
	root["--config"], root["-c"] = true, true
	for path, flags := range model {
		for _, f := range flags {
			if _, ok := out[path][f]; !ok && f != "--help-autocomplete" {
				t.Fatalf("forwarder %s --help does not show whether %s takes a value", strings.ReplaceAll(path, "_", " "), f)
			}
		}
	}
	return out
}

// commandLines are the forwarder command lines the pages show: lines of
// code blocks and code spans that start with `bin/forwarder ` or
// `forwarder ` once a `$ ` prompt and VAR=value assignments are taken off;
// continued lines (`\`) are joined.
func commandLines(t *testing.T) map[string]string {
	t.Helper()
	lines := map[string]string{}
	assign := regexp.MustCompile(`^(?:[A-Z_][A-Z0-9_]*=(?:'[^']*'|"[^"]*"|\S*)\s+)+`)
	consider := func(page, s string) {
		s = strings.TrimPrefix(strings.TrimSpace(s), "$ ")
		s = assign.ReplaceAllString(s, "")
		if strings.HasPrefix(s, "bin/forwarder ") || strings.HasPrefix(s, "forwarder ") {
			if i := strings.Index(s, "  #"); i >= 0 { // a trailing comment
				s = s[:i]
			}
			lines[strings.TrimSpace(s)] = page
		}
	}
	span := regexp.MustCompile("`([^`\n]+)`")
	for page, text := range docPages(t) {
		inBlock := false
		var cont string
		sc := bufio.NewScanner(strings.NewReader(text))
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
				continue
			}
			if inBlock {
				if strings.HasSuffix(line, `\`) {
					cont += strings.TrimSuffix(line, `\`) + " "
					continue
				}
				consider(page, cont+line)
				cont = ""
				continue
			}
			for _, m := range span.FindAllStringSubmatch(line, -1) {
				consider(page, m[1])
			}
		}
	}
	if len(lines) < 10 {
		t.Fatalf("found only %v in the docs: the scan is broken", lines)
	}
	return lines
}

// TestDocumentedCommandsParse: every forwarder command line in the docs
// names commands the binary has and flags those commands take, before any
// argument (no flag after one is read), a flag's value only where the flag
// takes one, and `<command> --help` succeeds for every command.
func TestDocumentedCommandsParse(t *testing.T) {
	t.Parallel()
	model := cliModel(t)
	values := flagValues(t, model)
	for line, page := range commandLines(t) {
		fields := strings.Fields(line)[1:] // after bin/forwarder
		path := "forwarder"
		var args []string
		afterFlag := false // the token before was a flag that takes a value, without =value
		for _, f := range fields {
			f = strings.TrimSuffix(strings.Trim(f, "[]"), "...")
			f = strings.TrimSuffix(f, "]")
			if f == "" || f == "|" || strings.HasPrefix(f, "#") {
				if f == "|" || strings.HasPrefix(f, "#") {
					break
				}
				continue
			}
			if strings.HasPrefix(f, "-") {
				if len(args) > 0 {
					// urfave/cli reads no flag after the first argument.
					t.Errorf("%s: `%s`: %s comes after the argument %s, where it is not read as a flag", page, line, f, args[0])
				}
				flag, _, hasValue := strings.Cut(f, "=")
				takes, known := values[path][flag]
				if !known && slices.Contains(model["forwarder"], flag) {
					takes, known = values["forwarder"][flag]
				}
				if !known {
					t.Errorf("%s: `%s`: %s takes no flag %s (it takes %v)", page, line, strings.ReplaceAll(path, "_", " "), flag, model[path])
				}
				afterFlag = takes && !hasValue
				continue
			}
			// The value of the flag before, a subcommand when the current
			// command has one of that name, else an argument.
			if afterFlag {
				afterFlag = false
				continue
			}
			if _, ok := model[path+"_"+f]; ok {
				path += "_" + f
				continue
			}
			args = append(args, f)
		}
		if len(args) > 0 && hasSubcommands(model, path) {
			t.Errorf("%s: `%s`: %s has no command %s", page, line, strings.ReplaceAll(path, "_", " "), args[0])
		}
	}
}

// hasSubcommands reports whether the command at path has subcommands (and
// so takes no arguments of its own).
func hasSubcommands(model map[string][]string, path string) bool {
	for p := range model {
		if strings.HasPrefix(p, path+"_") {
			return true
		}
	}
	return false
}

// namedTest is a test a page names: its package directory, its name
// (`TestX/Sub` for a subtest) and where the page names it.
// lineSpan is a Markdown code span within one line (across lines, the
// backticks of a fenced block would pair with a span's); testName a test's
// name as go test -run takes it, subtests included.
var (
	lineSpan = regexp.MustCompile("`([^`\n]+)`")
	testName = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*(/[^/\s]+)*$`)
)

type namedTest struct {
	pkg, name, row string
}

// guaranteeTests are the tests docs/guarantees.md names in its "proven by"
// column: a code span naming a package directory (`plugins/kafka`) sets the
// package of the test names that follow it (`TestX`, `TestX/Sub`,
// `BenchmarkX`), until the next package. Any other span (a command) is
// neither.
func guaranteeTests(t *testing.T) []namedTest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "guarantees.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []namedTest
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "|") {
			continue
		}
		row := strings.TrimSpace(cells[0])
		pkg := ""
		for _, m := range lineSpan.FindAllStringSubmatch(cells[len(cells)-1], -1) {
			s := m[1]
			switch {
			case testName.MatchString(s):
				if pkg == "" {
					t.Errorf("docs/guarantees.md row %s: %s is named before any package", row, s)
					continue
				}
				out = append(out, namedTest{pkg: pkg, name: s, row: row})
			case isGoPackage(s):
				pkg = s
			}
		}
	}
	if len(out) < 30 {
		t.Fatalf("found only %d tests in docs/guarantees.md: the scan is broken (%v)", len(out), out)
	}
	return out
}

// isGoPackage reports whether p is a directory of the module holding Go
// files.
func isGoPackage(p string) bool {
	if strings.ContainsAny(p, " .") || !strings.Contains(p, "/") {
		return false
	}
	matches, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(p), "*.go"))
	return len(matches) > 0
}

// TestGuaranteesNameRealTests: every test docs/guarantees.md cites as the
// proof of a promise exists in the package it names, subtests included, so
// a renamed, moved or deleted test cannot leave a promise proven by nothing.
func TestGuaranteesNameRealTests(t *testing.T) {
	t.Parallel()
	funcs := map[string]map[string]*ast.FuncDecl{}
	for _, nt := range guaranteeTests(t) {
		if funcs[nt.pkg] == nil {
			funcs[nt.pkg] = testFuncs(t, nt.pkg)
		}
		top, subs, _ := strings.Cut(nt.name, "/")
		fn := funcs[nt.pkg][top]
		if fn == nil {
			t.Errorf("docs/guarantees.md row %s names %s %s: %s has no func %s", nt.row, nt.pkg, nt.name, nt.pkg, top)
			continue
		}
		if sub := missingSubtest(fn, subs); sub != "" {
			t.Errorf("docs/guarantees.md row %s names %s %s: %s has no subtest %q", nt.row, nt.pkg, nt.name, top, sub)
		}
	}
}

// TestPagesNameRealTests: every test the README or a page under docs/
// names (`TestX`, `TestX/Sub`, `BenchmarkX`) exists in the repository, its
// subtests included, so that a renamed or deleted test cannot leave a page
// pointing at nothing. (TestGuaranteesNameRealTests also checks, for
// docs/guarantees.md, that each is in the package the row names.)
func TestPagesNameRealTests(t *testing.T) {
	t.Parallel()
	// The test functions of every package, by name.
	funcs := map[string][]*ast.FuncDecl{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		dir, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		for name, fn := range testFuncs(t, dir) {
			funcs[name] = append(funcs[name], fn)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for page, text := range docPages(t) {
		for _, m := range lineSpan.FindAllStringSubmatch(text, -1) {
			if !testName.MatchString(m[1]) {
				continue
			}
			checked++
			top, subs, _ := strings.Cut(m[1], "/")
			fns := funcs[top]
			if len(fns) == 0 {
				t.Errorf("%s names %s: the repository has no func %s", page, m[1], top)
				continue
			}
			if !slices.ContainsFunc(fns, func(fn *ast.FuncDecl) bool { return missingSubtest(fn, subs) == "" }) {
				t.Errorf("%s names %s: %s has no such subtest", page, m[1], top)
			}
		}
	}
	t.Logf("%d tests named by the pages", checked)
	if checked < 100 {
		t.Fatalf("found only %d tests named by the pages: the scan is broken", checked)
	}
}

// missingSubtest returns the part of subs (a/b/c, "" for none) from the
// first subtest fn does not have, or "".
func missingSubtest(fn *ast.FuncDecl, subs string) string {
	if subs == "" {
		return ""
	}
	body := ast.Node(fn.Body)
	for path := subs; path != ""; {
		next, rest := subtest(body, path)
		if next == nil {
			return path
		}
		body, path = next, rest
	}
	return ""
}

// testFuncs parses the _test.go files of the package in dir and returns
// their top-level functions by name.
func testFuncs(t *testing.T, dir string) map[string]*ast.FuncDecl {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(dir), "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]*ast.FuncDecl{}
	for _, p := range paths {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parsing %s: %v", p, err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Body != nil {
				out[fn.Name.Name] = fn
			}
		}
	}
	return out
}

// subtest finds, in node, the function literal of the subtest that path
// (a/b/c) begins with, and returns it with the rest of path: the body of a
// `x.Run(name, func...)` call whose name is the path's first segments (a
// name may hold a "/"; Go's subtest names have spaces as underscores),
// or, when the name is formatted (`fmt.Sprintf("finished=%d", n)`), whose
// format matches them; a path may end inside a name. A Run whose name is neither (a table of cases)
// matches when node holds the first segment as a string literal; its
// function is returned then.
func subtest(node ast.Node, path string) (ast.Node, string) {
	segments := strings.Split(path, "/")
	// leading says whether the path begins with name's segments (or, for
	// a path that ends inside name, with as many as it has, as `go test
	// -run` takes it), each compared by same, and returns the rest.
	leading := func(name string, same func(nameSegment, segment string) bool) (string, bool) {
		names := strings.Split(name, "/")
		k := min(len(names), len(segments))
		for i := range k {
			if !same(names[i], segments[i]) {
				return "", false
			}
		}
		return strings.Join(segments[k:], "/"), true
	}
	// The string literals in node: what a table of cases names its
	// subtests with.
	literals := map[string]bool{}
	ast.Inspect(node, func(n ast.Node) bool {
		if s, ok := n.(ast.Expr); ok {
			if v, ok := literal(s); ok {
				literals[strings.ReplaceAll(v, " ", "_")] = true
			}
		}
		return true
	})
	literally := func(n, s string) bool { return strings.ReplaceAll(n, " ", "_") == s }
	// A formatted name matches when each %s or %v of it writes one of
	// the literals.
	formatted := func(n, s string) bool {
		m := formatPattern(n).FindStringSubmatch(s)
		return m != nil && !slices.ContainsFunc(m[1:], func(v string) bool { return !literals[v] })
	}
	var found, table ast.Node
	var rest string
	ast.Inspect(node, func(n ast.Node) bool {
		if found != nil {
			return false
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Run" || len(n.Args) != 2 {
				return true
			}
			fn, ok := n.Args[1].(*ast.FuncLit)
			if !ok {
				return true
			}
			if name, ok := literal(n.Args[0]); ok {
				if after, ok := leading(name, literally); ok {
					found, rest = fn, after
					return false
				}
				return true
			}
			if format, ok := sprintfFormat(n.Args[0]); ok {
				if after, ok := leading(format, formatted); ok {
					found, rest = fn, after
					return false
				}
				return true
			}
			if table == nil {
				table = fn
			}
		}
		return true
	})
	if found == nil && literals[segments[0]] && table != nil {
		return table, strings.Join(segments[1:], "/")
	}
	return found, rest
}

// literal is the value of e when it is a string literal.
func literal(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// sprintfFormat is the format of e when it is a fmt.Sprintf call with a
// literal one.
func sprintfFormat(e ast.Expr) (string, bool) {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return "", false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Sprintf" {
		return "", false
	}
	if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "fmt" {
		return "", false
	}
	return literal(call.Args[0])
}

// formatPattern matches what a format of fmt.Sprintf writes: each verb
// stands for any text without a "/" (spaces as underscores, as in a
// subtest's name), and what each %s or %v writes is a group.
func formatPattern(format string) *regexp.Regexp {
	verb := regexp.MustCompile(`%[-+# 0-9.]*[a-zA-Z%]`)
	var b strings.Builder
	b.WriteString("^")
	at := 0
	for _, m := range verb.FindAllStringIndex(format, -1) {
		b.WriteString(regexp.QuoteMeta(strings.ReplaceAll(format[at:m[0]], " ", "_")))
		switch format[m[1]-1] {
		case '%':
			b.WriteString("%")
		case 's', 'v':
			b.WriteString("([^/]*)")
		default:
			b.WriteString("[^/]*")
		}
		at = m[1]
	}
	b.WriteString(regexp.QuoteMeta(strings.ReplaceAll(format[at:], " ", "_")) + "$")
	return regexp.MustCompile(b.String())
}
