package mappingfile

import (
	"cmp"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

const (
	// platformTZEnv names the zone the platform expects event times in
	// (docs/configuration.md); unset or empty means defaultPlatformTZ.
	platformTZEnv     = "PLATFORM_TZ"
	defaultPlatformTZ = "Asia/Shanghai"

	// tsFormatPlatformName is the method's name, as registered; mapping
	// files keep it although it is impure (see mappingEnvironment).
	tsFormatPlatformName = "ts_format_platform"
)

func tsFormatPlatformSpec() *bloblang.PluginSpec {
	return bloblang.NewPluginSpec().
		Category("Timestamp Manipulation").
		Impure().
		Description(`Formats a timestamp like `+"`ts_format`"+`, in the time zone named by the environment variable `+"`PLATFORM_TZ`"+` (`+"`Asia/Shanghai`"+` when it is unset or empty). The target is a unix time in seconds (a fraction gives sub-second precision) or a string in RFC 3339 format, as for `+"`ts_format`"+`.

`+"`this.t.ts_format_platform(f)`"+` gives the same result as `+"`this.t.ts_format(f, env(\"PLATFORM_TZ\").not_empty().catch(\"Asia/Shanghai\"))`"+` but is much cheaper: `+"`ts_format`"+` with a zone that is not a literal loads the zone database for every message, while this method loads the zone once and reuses it for as long as `+"`PLATFORM_TZ`"+` keeps its value. The variable is read at each call, so `+"`environment:`"+` in a `+"`forwarder test`"+` case applies.

A `+"`PLATFORM_TZ`"+` that is not a known zone name is an error for every message, naming the variable and its value.`).
		Param(bloblang.NewStringParam("format").Description("The output format, as for `ts_format`: how the reference time Mon Jan 2 15:04:05 -0700 MST 2006 would be displayed.")).
		Example("Epoch milliseconds as the platform's local time, truncated to the second (PLATFORM_TZ unset: Asia/Shanghai).",
			`root.event_time = (this.inoutTime / 1000).floor().ts_format_platform("2006-01-02 15:04:05")`,
			[2]string{`{"inoutTime":1779330600999}`, `{"event_time":"2026-05-21 10:30:00"}`},
		).
		Example("An RFC 3339 string is converted to the platform's zone (PLATFORM_TZ unset: Asia/Shanghai).",
			`root.at = this.at.ts_format_platform("2006-01-02 15:04:05 -07:00")`,
			[2]string{`{"at":"2026-05-21T02:30:00Z"}`, `{"at":"2026-05-21 10:30:00 +08:00"}`},
		)
}

func init() {
	// Spelled out: internal/docgen finds our plugins by their registrations.
	bloblang.MustRegisterMethodV2("ts_format_platform", tsFormatPlatformSpec(),
		func(args *bloblang.ParsedParams) (bloblang.Method, error) {
			layout, err := args.GetString("format")
			if err != nil {
				return nil, err
			}
			return bloblang.TimestampMethod(func(t time.Time) (any, error) {
				loc, err := platformLocation()
				if err != nil {
					return nil, err
				}
				return t.In(loc).Format(layout), nil
			}), nil
		})
}

// platformZone is a zone loaded for one value of PLATFORM_TZ.
type platformZone struct {
	env string // PLATFORM_TZ as read; "" when unset or empty
	loc *time.Location
	err error
}

// lastPlatformZone caches the zone of the last PLATFORM_TZ value seen. A
// process has one value, so one entry is enough; a test that changes the
// variable only reloads when it does.
var lastPlatformZone atomic.Pointer[platformZone]

// platformLocation returns the zone named by PLATFORM_TZ, or Asia/Shanghai
// when it is unset or empty. A bad name is cached as its error, so it costs
// no zone database read per message either.
func platformLocation() (*time.Location, error) {
	env := os.Getenv(platformTZEnv)
	if z := lastPlatformZone.Load(); z != nil && z.env == env {
		return z.loc, z.err
	}
	z := &platformZone{env: env}
	if z.loc, z.err = time.LoadLocation(cmp.Or(env, defaultPlatformTZ)); z.err != nil {
		z.err = fmt.Errorf("loading %s %q: %w", platformTZEnv, env, z.err)
	}
	lastPlatformZone.Store(z)
	return z.loc, z.err
}
