// Command forwarder is a Benthos distribution that moves parking camera events
// from Kafka to the parking platform through a PostgreSQL outbox.
package main

import (
	"context"
	"os"
	"runtime/debug"

	// PLATFORM_TZ must resolve in an image without /usr/share/zoneinfo
	// (the container image is distroless/static): embed the zone database.
	_ "time/tzdata"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/forwarder/forwarder/internal/outboxcli"
	_ "github.com/forwarder/forwarder/plugins/all"
	"github.com/forwarder/forwarder/plugins/mapping"
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
	tuneGC()
	service.RunCLI(
		context.Background(),
		service.CLIOptSetVersion(version, dateBuilt),
		service.CLIOptSetBinaryName("forwarder"),
		service.CLIOptSetProductName("forwarder"),
		service.CLIOptAddCommand(outboxcli.Command()),
		service.CLIOptAddCommand(healthcheckCommand()),
		service.CLIOptOnConfigParse(checkOnStart),
	)
}

// checkOnStart refuses to start what could only fail every message: a
// PLATFORM_TZ that is not a zone, or a database schema newer than this
// binary. It runs once the config is parsed, before any component starts
// (not for lint or test).
func checkOnStart(conf *service.ParsedConfig) error {
	if err := mapping.CheckPlatformTZ(); err != nil {
		return err
	}
	return outboxcli.CheckSchemaOnStart(conf)
}
