// Package linttest checks that `forwarder lint` and start-up refuse the same
// values of a plugin's fields, with the same words.
package linttest

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Case is one config of a component.
type Case struct {
	Name string
	// YAML is the component's config, added to the base config of Run; a
	// top-level field here replaces the base's line of that field.
	YAML string
	// Want is part of the error that both lint and start-up give, empty
	// when both accept the config.
	Want string
	// Env is set while the config is linted and started (for
	// `${VAR:default}` interpolation); unset variables read as unset.
	Env map[string]string
}

// Run lints every case as a stream config, wrap(base + c.YAML), and starts
// the component from base + c.YAML with start (which parses it with the
// component's spec and runs its constructor, never the network).
func Run(t *testing.T, base string, wrap func(string) string, start func(yaml string) error, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			conf := merge(base, c.YAML)
			lints := Lint(t, wrap(conf), c.Env)
			err := start(replaceEnv(conf, c.Env))
			if c.Want == "" {
				if len(lints) > 0 {
					t.Errorf("lint refuses it: %v", lints)
				}
				if err != nil {
					t.Errorf("start-up refuses it: %v", err)
				}
				return
			}
			if !strings.Contains(strings.Join(lints, "\n"), c.Want) {
				t.Errorf("lint gives %q, want a lint with %q", lints, c.Want)
			}
			if err == nil || !strings.Contains(err.Error(), c.Want) {
				t.Errorf("start-up gives %v, want an error with %q", err, c.Want)
			}
		})
	}
}

// Lint lints a stream config as `forwarder lint` does (after replacing
// `${VAR:default}` from env) and returns the lints' texts.
func Lint(t *testing.T, yaml string, env map[string]string) []string {
	t.Helper()
	linter := service.GlobalEnvironment().FullConfigSchema("", "").NewStreamConfigLinter().
		SetEnvVarLookupFunc(func(_ context.Context, name string) (string, bool) {
			v, ok := env[name]
			return v, ok
		})
	lints, err := linter.LintYAML([]byte(yaml))
	if err != nil {
		t.Fatalf("linting: %v", err)
	}
	texts := make([]string, len(lints))
	for i, l := range lints {
		texts[i] = l.Error()
	}
	return texts
}

// envRef is a `${VAR}` or `${VAR:default}` reference, as Benthos reads it.
var envRef = regexp.MustCompile(`\$\{([0-9A-Za-z_.]+)(:([^}]*))?\}`)

// replaceEnv replaces references as Benthos does before it parses a config.
func replaceEnv(yaml string, env map[string]string) string {
	return envRef.ReplaceAllStringFunc(yaml, func(ref string) string {
		m := envRef.FindStringSubmatch(ref)
		if v := env[m[1]]; v != "" {
			return v
		}
		return m[3]
	})
}

// Indent puts prefix before every line of s, for a component's config
// nested in a stream config.
func Indent(s, prefix string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(prefix + line + "\n")
	}
	return b.String()
}

// merge appends conf to base, leaving out the lines of base that set a
// top-level field conf sets.
func merge(base, conf string) string {
	set := map[string]bool{}
	for _, line := range strings.Split(conf, "\n") {
		if k, _, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "-") {
			set[k] = true
		}
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(base, "\n") {
		if k, _, ok := strings.Cut(line, ":"); !ok || !set[k] {
			b.WriteString(line)
		}
	}
	return b.String() + conf
}
