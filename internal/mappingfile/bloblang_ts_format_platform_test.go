package mappingfile

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

// The tests below set PLATFORM_TZ, so none of them runs in parallel.

// tsFormatPlatform runs `this.t.ts_format_platform(layout)` on the JSON in.
func tsFormatPlatform(t *testing.T, layout, in string) (string, error) {
	t.Helper()
	exec, err := bloblang.Parse(`root = this.t.ts_format_platform("` + layout + `")`)
	if err != nil {
		t.Fatal(err)
	}
	v, err := exec.Query(mustJSON(t, in))
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		t.Fatalf("ts_format_platform on %s gave %#v, want a string", in, v)
	}
	return s, nil
}

// mustJSON decodes in as Benthos decodes a message: numbers as json.Number.
func mustJSON(t *testing.T, in string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(in))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %s: %v", in, err)
	}
	return v
}

const platformLayout = "2006-01-02 15:04:05"

func TestTsFormatPlatform(t *testing.T) {
	// The documented example's event time, 2026-05-21 02:30:00.999 UTC.
	const event = `{"t": 1779330600.999}`

	for _, tc := range []struct {
		name, env, want string
		unset           bool
	}{
		{name: "UnsetIsShanghai", unset: true, want: "2026-05-21 10:30:00"},
		{name: "EmptyIsShanghai", env: "", want: "2026-05-21 10:30:00"},
		{name: "UTC", env: "UTC", want: "2026-05-21 02:30:00"},
		{name: "EuropeParisSummerTime", env: "Europe/Paris", want: "2026-05-21 04:30:00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(platformTZEnv, tc.env) // restores the variable afterwards
			if tc.unset {
				os.Unsetenv(platformTZEnv)
			}
			got, err := tsFormatPlatform(t, platformLayout, event)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("PLATFORM_TZ=%q: got %q, want %q", tc.env, got, tc.want)
			}
		})
	}

	t.Run("RFC3339StringTarget", func(t *testing.T) {
		t.Setenv(platformTZEnv, "")
		got, err := tsFormatPlatform(t, platformLayout+" -07:00", `{"t": "2026-05-21T02:30:00Z"}`)
		if err != nil {
			t.Fatal(err)
		}
		if want := "2026-05-21 10:30:00 +08:00"; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	})

	t.Run("NotATimestamp", func(t *testing.T) {
		t.Setenv(platformTZEnv, "")
		if got, err := tsFormatPlatform(t, platformLayout, `{"t": true}`); err == nil {
			t.Fatalf("a bool target gave %q, want an error", got)
		}
	})

	t.Run("FollowsEnvChange", func(t *testing.T) {
		// One compiled mapping, as forwarder test keeps between the cases
		// of a file: each call reads the variable again.
		exec, err := bloblang.Parse(`root = this.t.ts_format_platform("15:04")`)
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct{ env, want string }{
			{"UTC", "02:30"}, {"Asia/Tokyo", "11:30"}, {"", "10:30"}, {"UTC", "02:30"},
		} {
			t.Setenv(platformTZEnv, step.env)
			got, err := exec.Query(mustJSON(t, event))
			if err != nil {
				t.Fatalf("PLATFORM_TZ=%q: %v", step.env, err)
			}
			if got != step.want {
				t.Fatalf("PLATFORM_TZ=%q: got %v, want %s", step.env, got, step.want)
			}
		}
	})

	t.Run("BadZoneIsAnErrorNamingTheVariable", func(t *testing.T) {
		t.Setenv(platformTZEnv, "Mars/Olympus_Mons")
		_, err := tsFormatPlatform(t, platformLayout, event)
		if err == nil || !strings.Contains(err.Error(), `loading PLATFORM_TZ "Mars/Olympus_Mons": unknown time zone Mars/Olympus_Mons`) {
			t.Fatalf("got error %v, want one naming PLATFORM_TZ and its value", err)
		}
		// Fixing the variable fixes the next call.
		t.Setenv(platformTZEnv, "UTC")
		if got, err := tsFormatPlatform(t, platformLayout, event); err != nil || got != "2026-05-21 02:30:00" {
			t.Fatalf("after fixing PLATFORM_TZ: got %q, %v", got, err)
		}
	})
}

func TestPlatformLocationIsCached(t *testing.T) {
	t.Setenv(platformTZEnv, "Europe/Paris")
	first, err := platformLocation()
	if err != nil {
		t.Fatal(err)
	}
	// time.LoadLocation returns a new *Location each time: the same pointer
	// means the zone database was not read again.
	if again, _ := platformLocation(); again != first {
		t.Fatal("second call with the same PLATFORM_TZ loaded the zone again")
	}
	if first.String() != "Europe/Paris" {
		t.Fatalf("got zone %s, want Europe/Paris", first)
	}

	t.Setenv(platformTZEnv, "UTC")
	if utc, _ := platformLocation(); utc.String() != "UTC" {
		t.Fatalf("after changing PLATFORM_TZ: got zone %s, want UTC", utc)
	}

	t.Setenv(platformTZEnv, "Nowhere/Land")
	_, first1 := platformLocation()
	_, again1 := platformLocation()
	if first1 == nil || first1 != again1 {
		t.Fatalf("a bad zone should be one cached error, got %v then %v", first1, again1)
	}
}

// The examples in the method's documentation are what they claim.
func TestTsFormatPlatformSpecExamples(t *testing.T) {
	t.Setenv(platformTZEnv, "")
	var results int
	bloblang.GlobalEnvironment().WalkMethods(func(name string, view *bloblang.MethodView) {
		if name != "ts_format_platform" {
			return
		}
		data := view.TemplateData()
		examples := data.Examples
		// A method with a category keeps its examples there.
		for _, c := range data.Categories {
			examples = append(examples, c.Examples...)
		}
		for _, ex := range examples {
			exec, err := bloblang.Parse(ex.Mapping)
			if err != nil {
				t.Fatalf("example %q: %v", ex.Mapping, err)
			}
			for _, io := range ex.Results {
				results++
				out, err := exec.Query(mustJSON(t, io[0]))
				if err != nil {
					t.Fatalf("example %q on %s: %v", ex.Mapping, io[0], err)
				}
				want := mustJSON(t, io[1])
				if got, wantS := bloblang.ValueToString(out), bloblang.ValueToString(want); got != wantS {
					t.Errorf("example %q on %s: got %s, want %s", ex.Mapping, io[0], got, wantS)
				}
			}
		}
	})
	if results == 0 {
		t.Fatal("found no examples of ts_format_platform in the global environment")
	}
}
