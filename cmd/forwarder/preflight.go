package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/envcheck"
)

// defaultConfigPaths are where Benthos looks for a config when none is
// given (its own defaults, set explicitly so that the pre-check reads the
// same file).
var defaultConfigPaths = []string{"/benthos.yaml", "/etc/benthos/config.yaml", "/etc/benthos.yaml"}

// preflight checks the environment variables that the config files of this
// command use (docs/configuration.md), before Benthos reads the config and
// before any component, the metrics exporter included, is created: a bad
// value is reported by its variable, not by the field it lands in or by the
// first connection that fails. `run` (and the default command) and `streams`
// also require the platform credentials when the config sends to the
// platform; `lint` checks only the values that are set. `test` compiles the
// mapping files its test cases target (checkTestMappings). Other commands
// (echo, blobl) are left alone: their configs set their own environment.
func preflight(c *cli.Context) error {
	if c.Command.Name == "test" {
		checkTestMappings(c.App.Writer, c.Args().Slice())
		return nil
	}
	mode, files, ok := configFiles(c)
	if !ok || len(files) == 0 {
		return nil
	}
	if mode == envcheck.Run {
		catchEarlySignals()
	}
	res := envcheck.Check(envcheck.Scan(files...), mode, os.Getenv)
	if len(res.Problems) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("environment variables used by the config are not right (see docs/configuration.md):")
	for _, p := range res.Problems {
		b.WriteString("\n  " + p.Error())
	}
	return errors.New(b.String())
}

// configFiles are the config files the command is about to read, and what
// they are checked for.
func configFiles(c *cli.Context) (envcheck.Mode, []string, bool) {
	resources := firstSlice(c, "resources")
	switch name := c.Command.Name; {
	case name == "lint":
		files := expandLintPaths(c.Args().Slice())
		if p := c.String("config"); p != "" {
			files = append(files, p)
		}
		return envcheck.Lint, append(files, resources...), true
	case name == "run" || name == c.App.Name:
		p := c.Args().First()
		if name != "run" || p == "" {
			p = c.String("config")
		}
		if p == "" {
			p = defaultConfig()
		}
		return envcheck.Run, nonEmpty(append([]string{p}, resources...)), true
	case name == "streams":
		p := c.String("observability")
		if p == "" {
			p = c.String("config")
		}
		files := []string{p}
		for _, arg := range c.Args().Slice() {
			files = append(files, yamlFiles(arg)...)
		}
		return envcheck.Run, nonEmpty(append(files, resources...)), true
	}
	return envcheck.Lint, nil, false
}

// firstSlice is a string slice flag as Benthos reads it: the command's own,
// else the one given before the command.
func firstSlice(c *cli.Context, name string) []string {
	for _, ctx := range c.Lineage() {
		if v := ctx.StringSlice(name); len(v) > 0 {
			return v
		}
	}
	return nil
}

func defaultConfig() string {
	for _, p := range defaultConfigPaths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// expandLintPaths resolves lint's arguments as Benthos does: `dir/...` is
// every .yaml/.yml file below dir, anything else a glob (or the path itself
// when nothing matches).
func expandLintPaths(args []string) []string {
	var files []string
	for _, a := range args {
		if strings.HasSuffix(a, "...") {
			dir := strings.TrimSuffix(strings.TrimSuffix(a, "..."), "/")
			if dir == "" || dir == "." {
				dir = "."
			}
			files = append(files, yamlFiles(dir)...)
			continue
		}
		if m, err := filepath.Glob(a); err == nil && len(m) > 0 {
			files = append(files, m...)
			continue
		}
		files = append(files, a)
	}
	return files
}

// yamlFiles is path itself when it is a file, else every .yaml/.yml file
// below it.
func yamlFiles(path string) []string {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return []string{path}
	}
	var files []string
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	return files
}

func nonEmpty(s []string) []string {
	out := s[:0]
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}
