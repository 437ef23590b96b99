package envcheck

import (
	"strings"
	"testing"
)

// TestPlatformCredentialsMustBeUTF8 checks that the platform credentials,
// sent inside a JSON body, are refused when they are not UTF-8 (they would
// arrive altered, and every request be refused), naming the variable and
// not showing the value; any UTF-8 text, YAML and libpq metacharacters
// included, is accepted.
func TestPlatformCredentialsMustBeUTF8(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD"} {
		v, ok := Lookup(name)
		if !ok {
			t.Fatalf("%s is not a known variable", name)
		}
		for _, good := range []string{"*S3cretRest", "info #tail", "a: b", "pä$$wörd", "line\nbreak", "trail  ", "${NOT_A_VAR}"} {
			if err := v.Check(good); err != nil {
				t.Errorf("%s=%q refused: %v", name, good, err)
			}
		}
		for _, bad := range []string{"Hunter2\xff", "\xc3(Hunter2"} {
			err := v.Check(bad)
			switch {
			case err == nil:
				t.Errorf("%s=%q (not UTF-8) accepted", name, bad)
			case !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "UTF-8"):
				t.Errorf("%s=%q: the error does not name the variable and say UTF-8: %v", name, bad, err)
			case strings.Contains(err.Error(), "Hunter2"):
				t.Errorf("%s: the error shows the secret: %v", name, err)
			}
		}
	}
}
