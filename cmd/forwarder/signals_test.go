package main

import (
	"testing"
	"time"
)

func TestAbandonBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		shutdown string
		want     time.Duration
	}{
		{"", abandonTimeout},
		{"30s", abandonTimeout},
		{"5s", abandonTimeout},
		{"2s", 2 * time.Second},
		// The smallest the config accepts: exit at once.
		{"0s", 0},
		// Refused before any signal is caught; the default bound stands.
		{"30", abandonTimeout},
		{"-1s", abandonTimeout},
	} {
		getenv := func(name string) string {
			if name == "SHUTDOWN_TIMEOUT" {
				return tc.shutdown
			}
			return ""
		}
		if got := abandonBound(getenv); got != tc.want {
			t.Errorf("SHUTDOWN_TIMEOUT=%q: an exit while starting waits up to %v, want %v", tc.shutdown, got, tc.want)
		}
	}
}
