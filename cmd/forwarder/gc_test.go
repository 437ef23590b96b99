package main

import (
	"math"
	"os"
	"runtime/debug"
	"testing"
)

// TestTuneGC: the defaults apply only where the environment sets nothing.
func TestTuneGC(t *testing.T) {
	restore := func(percent int, limit int64) {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
	defer restore(debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64))

	for _, tc := range []struct {
		name         string
		env          map[string]string
		wantPercent  int
		wantLimit    int64
		startPercent int
		startLimit   int64
	}{
		{"Unset", nil, defaultGCPercent, defaultMemoryLimit, 100, math.MaxInt64},
		{"GOGCSet", map[string]string{"GOGC": "50"}, 50, defaultMemoryLimit, 50, math.MaxInt64},
		{"GOMEMLIMITSet", map[string]string{"GOMEMLIMIT": "1GiB"}, defaultGCPercent, 1 << 30, 100, 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
				if v, ok := tc.env[k]; ok {
					t.Setenv(k, v)
				} else {
					t.Setenv(k, "")
					os.Unsetenv(k)
				}
			}
			// What the runtime would have read from that environment.
			restore(tc.startPercent, tc.startLimit)
			tuneGC()
			if got := debug.SetGCPercent(tc.startPercent); got != tc.wantPercent {
				t.Errorf("GC percent %d, want %d", got, tc.wantPercent)
			}
			if got := debug.SetMemoryLimit(-1); got != tc.wantLimit {
				t.Errorf("memory limit %d, want %d", got, tc.wantLimit)
			}
		})
	}
}
