package plural

import "testing"

func TestCount(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 rows"},
		{1, "1 row"},
		{2, "2 rows"},
		{-1, "-1 rows"},
		{9223372036854775807, "9223372036854775807 rows"},
	} {
		if got := Count(c.n, "row", "rows"); got != c.want {
			t.Errorf("Count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if got := Count(1, "request at once", "requests at once"); got != "1 request at once" {
		t.Errorf("Count(1) of a phrase = %q", got)
	}
}
