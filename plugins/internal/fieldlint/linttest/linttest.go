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

// Kind is where a component sits in a stream config.
type Kind int

// The kinds of component our plugins are.
const (
	Input Kind = iota
	Processor
	Output
	Metrics
	Tracer
)

// Component is the plugin whose fields the cases set.
type Component struct {
	Kind Kind
	// Name is the component's name in a config, e.g. kafka_franz.
	Name string
	Spec *service.ConfigSpec
	// Build runs the component's constructor on a parsed config (never the
	// network), as start-up does.
	Build func(*service.ParsedConfig) error
	// Base is the config every case starts from.
	Base string
}

// Run lints every case as a stream config holding the component with
// c.Base + case.YAML, and starts the component from the same config
// (Spec.ParseYAML, then Build); both must refuse it with case.Want, or
// both accept it.
func (c Component) Run(t *testing.T, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			conf := merge(c.Base, tc.YAML)
			lints := lint(t, c.stream(conf), tc.Env)
			err := c.start(replaceEnv(conf, tc.Env))
			if tc.Want == "" {
				if len(lints) > 0 {
					t.Errorf("lint refuses it: %v", lints)
				}
				if err != nil {
					t.Errorf("start-up refuses it: %v", err)
				}
				return
			}
			if !strings.Contains(strings.Join(lints, "\n"), tc.Want) {
				t.Errorf("lint gives %q, want a lint with %q", lints, tc.Want)
			}
			if err == nil || !strings.Contains(err.Error(), tc.Want) {
				t.Errorf("start-up gives %v, want an error with %q", err, tc.Want)
			}
		})
	}
}

func (c Component) start(yaml string) error {
	conf, err := c.Spec.ParseYAML(yaml, nil)
	if err != nil {
		return err
	}
	return c.Build(conf)
}

// stream is a stream config with the component configured by conf and
// whatever else a stream needs around it.
func (c Component) stream(conf string) string {
	const (
		generate = "input:\n  generate:\n    mapping: 'root = {}'\n"
		drop     = "output:\n  drop: {}\n"
	)
	head := "  " + c.Name + ":\n"
	switch c.Kind {
	case Input:
		return "input:\n" + head + indent(conf, "    ") + drop
	case Processor:
		return generate + "pipeline:\n  processors:\n    - " + c.Name + ":\n" + indent(conf, "        ") + drop
	case Output:
		return generate + "output:\n" + head + indent(conf, "    ")
	case Metrics:
		return generate + drop + "metrics:\n" + head + indent(conf, "    ")
	default:
		return "tracer:\n" + head + indent(conf, "    ")
	}
}

// lint lints a stream config as `forwarder lint` does (after replacing
// `${VAR:default}` from env) and returns the lints' texts.
func lint(t *testing.T, yaml string, env map[string]string) []string {
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

// indent puts prefix before every line of s, for a component's config
// nested in a stream config.
func indent(s, prefix string) string {
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
