// Command forwarder is a Benthos distribution that moves parking camera events
// from Kafka to the parking platform through a PostgreSQL outbox.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	// PLATFORM_TZ must resolve in an image without /usr/share/zoneinfo
	// (the container image is distroless/static): embed the zone database.
	_ "time/tzdata"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/forwarder/forwarder/internal/launch"
	"github.com/forwarder/forwarder/internal/outboxcli"
	_ "github.com/forwarder/forwarder/plugins/all"
)

// Set at build time with -ldflags "-X main.version=... -X main.dateBuilt=...".
var (
	version   = "dev"
	dateBuilt = "unknown"
)

// Garbage collector defaults, used when the environment does not set GOGC or
// GOMEMLIMIT. Every message allocates (Benthos messages, Bloblang, JSON,
// HTTP), and at the default GOGC=100 the collector took ~15 % of the CPU
// draining a backlog; at 200 that drops by about half (docs/benchmarks.md).
// The soft limit keeps the peak resident size within the 150 MB budget that
// a doubled GOGC alone exceeded: near it the collector simply runs sooner.
const (
	defaultGCPercent   = 200
	defaultMemoryLimit = 100 << 20
)

func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}

func main() {
	if err := flagAfterPath(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	tuneGC()
	setHelp()
	// No outbox row is claimed until Benthos listens for SIGTERM: one
	// before would kill the process with its claims held (package launch;
	// signals.go). Commands that build no stream never wait on it.
	launch.Process.Hold()
	service.RunCLI(
		context.Background(),
		service.CLIOptSetVersion(version, dateBuilt),
		service.CLIOptSetBinaryName("forwarder"),
		service.CLIOptSetProductName("forwarder"),
		service.CLIOptSetEnvironment(environment()),
		service.CLIOptSetDefaultConfigPaths(defaultConfigPaths...),
		service.CLIOptCustomRunFlags(nil, preflight),
		service.CLIOptAddCommand(outboxcli.Command()),
		service.CLIOptAddCommand(healthcheckCommand()),
		service.CLIOptOnConfigParse(outboxcli.CheckSchemaOnStart),
		service.CLIOptOnStreamStart(onStreamStart),
	)
}

// environment is every registered plugin, with a Bloblang environment
// without the helpers that our plugins register only for their spec lint
// rules (see lintHelper): those rules are compiled when the specs are built,
// from the global environment, and keep working; configs cannot call the
// helpers, and `forwarder list` does not show them.
func environment() *service.Environment {
	global := bloblang.GlobalEnvironment()
	var methods, functions []string
	global.WalkMethods(func(name string, _ *bloblang.MethodView) {
		if lintHelper(name) {
			methods = append(methods, name)
		}
	})
	global.WalkFunctions(func(name string, _ *bloblang.FunctionView) {
		if lintHelper(name) {
			functions = append(functions, name)
		}
	})
	env := service.NewEnvironment()
	env.UseBloblangEnvironment(global.WithoutMethods(methods...).WithoutFunctions(functions...))
	return env
}

// lintHelper says whether a Bloblang plugin is a helper of a spec lint rule:
// by convention their names end in _lint or _lints (http_forwarder's
// http_forwarder_rule_lints and http_forwarder_lease_lints, mapping_file's
// mapping_file_lint).
func lintHelper(name string) bool {
	return strings.HasSuffix(name, "_lint") || strings.HasSuffix(name, "_lints")
}
