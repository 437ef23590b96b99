package outboxcli_test

import (
	"strings"
	"testing"
)

// TestOperatorGivenEmpty: every command that writes the operator log
// refuses an --operator given empty (a script's unset variable) instead of
// signing the log with $USER, and changes nothing.
func TestOperatorGivenEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{
		{"pause"},
		{"resume"},
		{"release", "--key", "P1/B1"},
		{"requeue", "--since", "1d"},
		{"purge", "--older-than", "30d"},
	} {
		args = append(args, "--operator", " ")
		out, err := b.run(t, args...)
		if err == nil || !strings.Contains(out+err.Error(), "--operator must not be empty") {
			t.Errorf("%s: %v\n%s, want --operator refused", strings.Join(args, " "), err, out)
		}
	}
	if log := b.operatorLog(t); len(log) != 0 {
		t.Errorf("refused commands wrote the operator log: %+v", log)
	}
}
