package envcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Ref is a variable a config uses.
type Ref struct {
	// Var is its name and kind.
	Var Var
	// Default is the default written in the file (`${NAME:default}`), "" if
	// none.
	Default string
	// File is the first file that uses it.
	File string
	// Required is true when the service cannot start without it: the
	// platform credentials http_forwarder adds to every request. Lint does
	// not require them.
	Required bool
	// RequiredBy says who needs it, for the message.
	RequiredBy string
}

// Refs are the variables some config files use, by name.
type Refs map[string]*Ref

// envRef matches Benthos's `${NAME}` and `${NAME:default}` interpolations;
// `$${NAME}` is an escaped literal and does not count.
var envRef = regexp.MustCompile(`(\$?)\$\{([0-9A-Za-z_.]+)(?::((?:\$\{[^}]+\}|[^}])*))?\}`)

// blobl imports, resolved against the importing file's directory.
var blobImport = regexp.MustCompile(`(?m)^\s*import\s+"([^"]+)"`)

// Components whose PostgreSQL connection and credentials (and kafka_franz's
// SASL passwords) our plugins can read from the environment themselves: when the field is absent, the
// variable named by <field>_env (default the documented name) is read.
var (
	dsnComponents = map[string]bool{"outbox": true, "outbox_retry": true, "outbox_dead_letter": true, "http_forwarder": true}
	credentials   = []struct{ field, defaultVar string }{
		{"access_name", "PLATFORM_ACCESS_NAME"},
		{"access_pwd", "PLATFORM_ACCESS_PWD"},
	}
)

// Scan reads the config files and returns the variables they use. A file
// that cannot be read is left out: Benthos reports it.
func Scan(paths ...string) Refs {
	refs := Refs{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		refs.scanConfig(p, b)
	}
	return refs
}

func (r Refs) add(v Var, def, file string) *Ref {
	if ref, ok := r[v.Name]; ok {
		return ref
	}
	ref := &Ref{Var: v, Default: def, File: file}
	r[v.Name] = ref
	return ref
}

// known returns the variable called name, Text when it is not one of ours.
func known(name string) Var {
	if v, ok := Lookup(name); ok {
		return v
	}
	return Var{Name: name, Kind: Text}
}

func (r Refs) scanConfig(file string, b []byte) {
	text := string(b)
	for _, m := range envRef.FindAllStringSubmatch(text, -1) {
		if m[1] == "$" {
			continue
		}
		r.add(known(m[2]), m[3], file)
	}

	var root any
	if err := yaml.Unmarshal(b, &root); err != nil {
		return // Benthos reports the YAML error
	}
	usesZone := strings.Contains(text, "ts_format_platform")
	if tracer, ok := root.(map[string]any)["tracer"].(map[string]any); ok && tracer["otlp"] != nil {
		// The OpenTelemetry exporter reads these itself: a config never
		// names them, and a wrong one would only show as spans lost.
		for _, name := range otlpVars {
			r.add(known(name), "", file)
		}
	}
	walk(root, func(key string, conf map[string]any) {
		if dsnComponents[key] {
			r.envField(file, conf, "dsn", "DATABASE_URL")
			r.envField(file, conf, "direct_dsn", "DATABASE_DIRECT_URL")
		}
		if key == "http_forwarder" {
			for _, c := range credentials {
				ref := r.envField(file, conf, c.field, c.defaultVar)
				if ref != nil {
					ref.Required, ref.RequiredBy = true, "http_forwarder adds it to every request"
				}
			}
		}
		if key == "kafka_franz" {
			sasl, _ := conf["sasl"].([]any)
			for _, entry := range sasl {
				if m, ok := entry.(map[string]any); ok {
					r.envField(file, m, "password", "KAFKA_SASL_PASSWORD")
				}
			}
		}
		if key == "mapping_file" {
			if p, ok := conf["path"].(string); ok && blobUsesZone(p, map[string]bool{}) {
				usesZone = true
			}
		}
	})
	if usesZone {
		r.add(known("PLATFORM_TZ"), "", file)
	}
}

// otlpVars are the OpenTelemetry exporter's variables that the otlp tracer
// depends on (docs/configuration.md, "Tracing").
var otlpVars = []string{
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_CERTIFICATE",
}

// envField notes the variable behind a component field: the one its value
// interpolates when it is exactly `${NAME}` or `${NAME:}` (a variable with no
// default), or, when the field is absent, the one the plugin reads itself
// (<field>_env, default defaultVar). It returns nil when the field holds
// anything else.
func (r Refs) envField(file string, conf map[string]any, field, defaultVar string) *Ref {
	v, present := conf[field]
	if !present {
		name := defaultVar
		if s, ok := conf[field+"_env"].(string); ok && s != "" && !strings.Contains(s, "${") {
			name = s
		}
		kind := known(defaultVar)
		kind.Name = name
		return r.add(kind, "", file)
	}
	s, _ := v.(string)
	m := envRef.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil || m[0] != strings.TrimSpace(s) || m[1] == "$" || m[3] != "" {
		return nil
	}
	return r[m[2]]
}

// walk calls fn for every mapping value of the tree with its key.
func walk(node any, fn func(key string, conf map[string]any)) {
	switch n := node.(type) {
	case map[string]any:
		for k, v := range n {
			if m, ok := v.(map[string]any); ok {
				fn(k, m)
			}
			walk(v, fn)
		}
	case []any:
		for _, v := range n {
			walk(v, fn)
		}
	}
}

// blobUsesZone reports whether the Bloblang file at path, or a file it
// imports, calls ts_format_platform (which reads PLATFORM_TZ). Paths are
// relative to the working directory, imports to their file's directory, as
// Bloblang resolves them.
func blobUsesZone(path string, seen map[string]bool) bool {
	if strings.Contains(path, "${") || seen[path] {
		return false
	}
	seen[path] = true
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	if strings.Contains(string(b), "ts_format_platform") {
		return true
	}
	for _, m := range blobImport.FindAllStringSubmatch(string(b), -1) {
		imp := m[1]
		if !filepath.IsAbs(imp) {
			imp = filepath.Join(filepath.Dir(path), imp)
		}
		if blobUsesZone(imp, seen) {
			return true
		}
	}
	return false
}
