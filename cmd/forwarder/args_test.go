package main

import (
	"strings"
	"testing"
)

// TestFlagAfterPath: a flag after a path of lint, test or streams is refused naming
// both (urfave/cli would read it as a path); flags before the paths, their
// values, "--" and the other commands pass.
func TestFlagAfterPath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args string
		want string
	}{
		{"lint ./pipelines/... --skip-env-var-check", "forwarder lint: flag --skip-env-var-check after the path ./pipelines/...: flags go before the paths"},
		{"lint a.yaml b.yaml --deprecated", "forwarder lint: flag --deprecated after the path a.yaml"},
		{"test ./mappings/... --log debug", "forwarder test: flag --log after the path ./mappings/..."},
		{"test --log debug ./mappings/... -r res.yaml", "forwarder test: flag -r after the path ./mappings/..."},
		{"--log.level debug lint x.yaml --labels", "forwarder lint: flag --labels after the path x.yaml"},
		{"streams a.yaml --chilled", "forwarder streams: flag --chilled after the path a.yaml"},
		{"streams -o root.yaml a.yaml b.yaml --no-api", "forwarder streams: flag --no-api after the path a.yaml"},
		{"lint --skip-env-var-check ./pipelines/...", ""},
		{"streams -o root.yaml --no-api ./streams/a.yaml ./streams/b.yaml", ""},
		{"lint --deprecated --labels a.yaml b.yaml", ""},
		{"test --log debug ./mappings/...", ""},
		{"test -r res.yaml -e .env ./pipelines/...", ""},
		{"test --log=debug ./mappings/...", ""},
		{"lint -- ./x.yaml --odd-name.yaml", ""},
		{"lint", ""},
		{"-c pipelines/forwarder.yaml", ""},
		{"-c lint.yaml --set a=b", ""},
		{"outbox show key-1 --json", ""}, // outbox refuses it itself
		{"run pipelines/forwarder.yaml --chilled", ""},
	} {
		err := flagAfterPath(strings.Fields(c.args))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused (%v), want it passed on", c.args, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.args, err, c.want)
		}
	}
}
