package main

import (
	"fmt"
	"strings"
)

// valueFlags are the flags of Benthos's commands (the service's, lint's,
// test's and streams') that take a value as the next argument.
var valueFlags = map[string]bool{
	"config": true, "c": true, "log.level": true, "log": true, "set": true, "s": true,
	"resources": true, "r": true, "env-file": true, "e": true, "templates": true, "t": true,
	"observability": true, "o": true,
}

// pathCommands are the commands that take any number of paths.
var pathCommands = map[string]bool{"lint": true, "test": true, "streams": true}

// flagAfterPath refuses a flag written after a path of `forwarder lint`,
// `forwarder test` or `forwarder streams` (args are the command line without
// the program's name).
// urfave/cli, on which Benthos builds its commands, reads no flag after the
// first argument: `forwarder lint ./pipelines/... --skip-env-var-check`
// linted a file named "--skip-env-var-check" ("open --skip-env-var-check:
// no such file or directory") and checked the variables anyway. "--" ends
// the flags, as it does for urfave/cli.
func flagAfterPath(args []string) error {
	command, rest := "", args
	for len(rest) > 0 && command == "" {
		a := rest[0]
		rest = rest[1:]
		switch {
		case a == "--":
			return nil
		case strings.HasPrefix(a, "-"):
			if takesValue(a) && len(rest) > 0 {
				rest = rest[1:]
			}
		default:
			command = a
		}
	}
	if !pathCommands[command] {
		return nil
	}
	path := ""
	for len(rest) > 0 {
		a := rest[0]
		rest = rest[1:]
		switch {
		case a == "--":
			return nil
		case a == "-" || !strings.HasPrefix(a, "-"):
			if path == "" {
				path = a
			}
		case path != "":
			return fmt.Errorf("forwarder %s: flag %s after the path %s: flags go before the paths", command, a, path)
		case takesValue(a) && len(rest) > 0:
			rest = rest[1:]
		}
	}
	return nil
}

// takesValue says whether the flag arg is given its value as the next
// argument ("-r x", not "-r=x").
func takesValue(arg string) bool {
	name := strings.TrimLeft(arg, "-")
	return !strings.Contains(name, "=") && valueFlags[name]
}
