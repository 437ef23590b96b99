package httpforwarder

import (
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

func TestCleartextHost(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"http://platform.example.com/mch/business", "platform.example.com"},
		{"HTTP://10.0.0.7:8080/mch/heartbeat", "10.0.0.7"},
		{"http://[2001:db8::1]:8080/", "2001:db8::1"},
		{"https://platform.example.com/mch/business", ""},
		{"http://localhost:8080/mch/business", ""},
		{"http://127.0.0.1:8080/", ""},
		{"http://127.8.9.10/", ""},
		{"http://[::1]:8080/", ""},
		{"://not a url", ""},
	} {
		if got := cleartextHost(tc.url); got != tc.want {
			t.Errorf("cleartextHost(%q) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

// TestCleartextWarning: the output warns once at start-up when the
// credentials would cross the network in clear text, and names neither of
// them; a loopback or https platform gives no warning.
func TestCleartextWarning(t *testing.T) {
	for _, tc := range []struct {
		base string
		warn bool
	}{
		{"http://platform.example.com", true},
		{"https://platform.example.com", false},
		{"http://127.0.0.1:8080", false},
	} {
		logs := &logbuf.Buffer{}
		newTestOutput(t, baseYAML("postgres://localhost:1/none", tc.base, ""), logs)
		got := logs.String()
		if warned := strings.Contains(got, "unencrypted"); warned != tc.warn {
			t.Errorf("%s: warned=%v, want %v; logs:\n%s", tc.base, warned, tc.warn, got)
		}
		if strings.Contains(got, testAccessPwd) || strings.Contains(got, testAccessName) {
			t.Errorf("%s: the logs show a credential:\n%s", tc.base, got)
		}
	}
}
