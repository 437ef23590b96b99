// Command docgen writes docs/reference/: the manual of every plugin this
// distribution registers, rendered from the plugins' own specs, so that the
// reference cannot drift from the code. Run it with `go generate ./docs`
// (or `make docs`); a test fails when docs/reference is stale.
//
// It imports only our plugins (plugins/all), so the Benthos environment it
// walks holds our components and no built-in ones; Bloblang's built-in
// methods and functions are always registered, so ours are picked by name
// from the registrations in plugins/ and internal/ (ourBloblang: the
// methods mapping files use live with the mapping engine, internal/mappingfile).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/forwarder/forwarder/plugins/all"
)

func main() {
	out := flag.String("out", "docs/reference", "directory to write the reference into")
	src := flag.String("src", ".", "the repository's root, to find our Bloblang plugins in plugins/ and internal/")
	flag.Parse()
	if err := write(*out, *src); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

// write renders every page into dir, replacing the .md files there.
func write(dir, srcRoot string) error {
	pages, err := render(srcRoot)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	for _, p := range old {
		if _, keep := pages[filepath.Base(p)]; !keep {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for name, body := range pages {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// kind is one page of components.
type kind struct {
	File, Title string
	walk        func(env *service.Environment, fn func(string, *service.ConfigView))
}

var kinds = []kind{
	{"inputs.md", "Inputs", (*service.Environment).WalkInputs},
	{"processors.md", "Processors", (*service.Environment).WalkProcessors},
	{"outputs.md", "Outputs", (*service.Environment).WalkOutputs},
	{"metrics.md", "Metrics exporters", (*service.Environment).WalkMetrics},
	{"tracers.md", "Tracers", (*service.Environment).WalkTracers},
}

// render returns every page by file name.
func render(srcRoot string) (map[string][]byte, error) {
	env := service.GlobalEnvironment()
	pages := map[string][]byte{}
	type entry struct{ Kind, File, Name, Summary string }
	var index []entry
	for _, k := range kinds {
		var comps []service.TemplateDataPlugin
		var err error
		k.walk(env, func(name string, view *service.ConfigView) {
			if err != nil {
				return
			}
			var data service.TemplateDataPlugin
			if data, err = view.TemplateData(); err == nil {
				data.Name = name
				comps = append(comps, data)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.Title, err)
		}
		if len(comps) == 0 {
			continue
		}
		slices.SortFunc(comps, func(a, b service.TemplateDataPlugin) int { return strings.Compare(a.Name, b.Name) })
		for _, c := range comps {
			index = append(index, entry{k.Title, k.File, c.Name, c.Summary})
		}
		b, err := execute(componentPage, map[string]any{"Title": k.Title, "Components": comps})
		if err != nil {
			return nil, err
		}
		pages[k.File] = b
	}

	methods, functions, err := ourBloblang(filepath.Join(srcRoot, "plugins"), filepath.Join(srcRoot, "internal"))
	if err != nil {
		return nil, err
	}
	var ms []bloblang.TemplateMethodData
	var fs []bloblang.TemplateFunctionData
	bloblang.GlobalEnvironment().WalkMethods(func(name string, v *bloblang.MethodView) {
		if slices.Contains(methods, name) {
			ms = append(ms, v.TemplateData())
		}
	})
	bloblang.GlobalEnvironment().WalkFunctions(func(name string, v *bloblang.FunctionView) {
		if slices.Contains(functions, name) {
			fs = append(fs, v.TemplateData())
		}
	})
	if len(ms) != len(methods) || len(fs) != len(functions) {
		return nil, fmt.Errorf("plugins/ and internal/ register Bloblang methods %v and functions %v, the environment has %d and %d of them", methods, functions, len(ms), len(fs))
	}
	slices.SortFunc(ms, func(a, b bloblang.TemplateMethodData) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(fs, func(a, b bloblang.TemplateFunctionData) int { return strings.Compare(a.Name, b.Name) })
	for _, m := range ms {
		index = append(index, entry{"Bloblang methods", "bloblang.md", m.Name, firstSentence(m.Description)})
	}
	for _, f := range fs {
		index = append(index, entry{"Bloblang functions", "bloblang.md", f.Name, firstSentence(f.Description)})
	}
	b, err := execute(bloblangPage, map[string]any{"Methods": ms, "Functions": fs})
	if err != nil {
		return nil, err
	}
	pages["bloblang.md"] = b

	b, err = execute(indexPage, index)
	if err != nil {
		return nil, err
	}
	pages["README.md"] = b
	return pages, nil
}

// registration finds Bloblang plugins registered with a literal name.
var registration = regexp.MustCompile(`Register(Method|Function)V2\(\s*"([a-z0-9_]+)"`)

// ourBloblang lists the Bloblang methods and functions that the packages
// under dirs register, leaving out the helpers of spec lint rules (named
// *_lint or *_lints, registered under a constant name), which configs
// cannot call.
func ourBloblang(dirs ...string) (methods, functions []string, err error) {
	for _, dir := range dirs {
		if err := walkRegistrations(dir, &methods, &functions); err != nil {
			return nil, nil, err
		}
	}
	if len(methods)+len(functions) == 0 {
		err = fmt.Errorf("no Bloblang plugin registrations found under %v", dirs)
	}
	return methods, functions, err
}

func walkRegistrations(dir string, methods, functions *[]string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, werr error) error {
		if werr != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return werr
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range registration.FindAllStringSubmatch(string(src), -1) {
			if strings.HasSuffix(m[2], "_lint") || strings.HasSuffix(m[2], "_lints") {
				continue
			}
			if m[1] == "Method" {
				*methods = append(*methods, m[2])
			} else {
				*functions = append(*functions, m[2])
			}
		}
		return nil
	})
}

func firstSentence(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func execute(t *template.Template, data any) ([]byte, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return nil, err
	}
	// One blank line at most, and a single trailing newline.
	out := regexp.MustCompile(`\n{3,}`).ReplaceAll(b.Bytes(), []byte("\n\n"))
	return append(bytes.TrimRight(out, "\n"), '\n'), nil
}

const header = "<!-- Generated by `go generate ./docs` (internal/docgen) from the plugins' specs. Do not edit: change the spec and regenerate. -->\n"

// Benthos's specs are written for its AsciiDoc site; ours use two of its
// forms, which are turned into Markdown.
var (
	adocHeading = regexp.MustCompile(`(?m)^(={2,4}) (.+)$`)
	adocLink    = regexp.MustCompile(`(https?://[^\s\[]+)\[([^\]^]*)\^?\]`)
)

func markdown(s string) string {
	s = adocHeading.ReplaceAllStringFunc(s, func(h string) string {
		m := adocHeading.FindStringSubmatch(h)
		return strings.Repeat("#", len(m[1])+1) + " " + m[2]
	})
	return adocLink.ReplaceAllString(strings.TrimSpace(s), "[$2]($1)")
}

var funcs = template.FuncMap{
	"trim": markdown,
	"oneline": func(s string) string {
		s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
		return strings.ReplaceAll(s, "|", `\|`)
	},
	"anchor":     func(s string) string { return strings.ReplaceAll(strings.ToLower(s), ".", "") },
	"hasDefault": func(f service.TemplateDataPluginField) bool { return f.DefaultMarshalled != "" },
}

var indexPage = template.Must(template.New("index").Funcs(funcs).Parse(header + `
# Component reference

Every plugin this distribution adds to Benthos, rendered from its spec (the same text
` + "`forwarder lint`" + ` checks configs against). Benthos's own components are documented at
<https://docs.redpanda.com/redpanda-connect/components/about/>; ` + "`bin/forwarder list`" + ` shows
both.

| component | kind | summary |
|---|---|---|
{{range .}}| [` + "`{{.Name}}`" + `]({{.File}}#{{anchor .Name}}) | {{.Kind}} | {{oneline .Summary}} |
{{end}}`))

var componentPage = template.Must(template.New("components").Funcs(funcs).Parse(header + `
# {{.Title}}

{{range .Components}}- [` + "`{{.Name}}`" + `](#{{anchor .Name}})
{{end}}
{{range .Components}}
## {{.Name}}

{{trim .Summary}}

{{if .Status}}Status: {{.Status}}.{{end}}

{{trim .Description}}

### Configuration
{{if eq .CommonConfigYAML .AdvancedConfigYAML}}
` + "```yaml" + `
{{.AdvancedConfigYAML}}` + "```" + `
{{else}}
Common fields:

` + "```yaml" + `
{{.CommonConfigYAML}}` + "```" + `

Every field:

` + "```yaml" + `
{{.AdvancedConfigYAML}}` + "```" + `
{{end}}
### Fields
{{range .Fields}}
#### ` + "`{{.FullName}}`" + `

{{trim .Description}}

Type: ` + "`{{.Type}}`" + `{{if hasDefault .}} · default: ` + "`{{.DefaultMarshalled}}`" + `{{end}}{{if .IsSecret}} · secret: never printed{{end}}{{if .IsInterpolated}} · supports [interpolation](https://docs.redpanda.com/redpanda-connect/configuration/interpolation/#bloblang-queries){{end}}
{{if .AnnotatedOptions}}
| option | meaning |
|---|---|
{{range .AnnotatedOptions}}| ` + "`{{index . 0}}`" + ` | {{oneline (index . 1)}} |
{{end}}{{else if .Options}}
Options: {{range $i, $o := .Options}}{{if $i}}, {{end}}` + "`{{$o}}`" + `{{end}}.
{{end}}{{if .ExamplesMarshalled}}
` + "```yaml" + `
# Examples
{{range .ExamplesMarshalled}}
{{.}}{{end}}` + "```" + `
{{end}}{{end}}
{{if .Examples}}### Examples
{{range .Examples}}
#### {{.Title}}

{{trim .Summary}}

` + "```yaml" + `
{{trim .Config}}
` + "```" + `
{{end}}{{end}}{{if .Footnotes}}
{{trim .Footnotes}}
{{end}}{{end}}`))

var bloblangPage = template.Must(template.New("bloblang").Funcs(funcs).Parse(header + `
# Bloblang methods and functions

Ours, in addition to Bloblang's own (<https://docs.redpanda.com/redpanda-connect/guides/bloblang/methods/>).
{{range .Methods}}
## {{.Name}}

Method{{if .Status}}, {{.Status}}{{end}}.

{{trim .Description}}
{{template "params" .Params}}{{range .Categories}}{{template "examples" .Examples}}{{end}}{{template "examples" .Examples}}{{end}}{{range .Functions}}
## {{.Name}}

Function{{if .Status}}, {{.Status}}{{end}}.

{{trim .Description}}
{{template "params" .Params}}{{template "examples" .Examples}}{{end}}
{{- define "params"}}{{if .Definitions}}
| parameter | type | meaning |
|---|---|---|
{{range .Definitions}}| ` + "`{{.Name}}`" + ` | {{.ValueType}}{{if .IsOptional}}, optional{{end}}{{if .DefaultMarshalled}}, default ` + "`{{.DefaultMarshalled}}`" + `{{end}} | {{oneline .Description}} |
{{end}}{{end}}{{end}}
{{- define "examples"}}{{range .}}
{{trim .Summary}}

` + "```coffee" + `
{{trim .Mapping}}
` + "```" + `
{{range .Results}}
- ` + "`{{index . 0}}` → `{{index . 1}}`" + `{{end}}
{{end}}{{end}}`))
