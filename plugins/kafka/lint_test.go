package kafka

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

const lintGood = `
input:
  kafka_franz:
    seed_brokers: [ "localhost:9092" ]
    topics: [ "device-vehicle-event" ]
    consumer_group: forwarder
output:
  kafka_franz:
    seed_brokers: [ "localhost:9092" ]
    topic: 'copy-${! @kafka_topic }'
    key: '${! @kafka_key }'
    metadata:
      include_prefixes: [ "kafka_" ]
`

// lintBad misspells consumer_group in the input and topic in the output.
var lintBad = strings.NewReplacer("consumer_group:", "consumer_grop:", "topic: 'copy", "topik: 'copy").Replace(lintGood)

func TestLintNamesMisspelledField(t *testing.T) {
	// Not parallel: it swaps os.Stderr to read the CLI's report, which
	// is safe only while no other test of the package runs.
	linter := service.GlobalEnvironment().FullConfigSchema("", "").NewStreamConfigLinter()

	lints, err := linter.LintYAML([]byte(lintGood))
	if err != nil || len(lints) != 0 {
		t.Fatalf("the good config has lints %v (err %v)", lints, err)
	}
	lints, err = linter.LintYAML([]byte(lintBad))
	if err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, l := range lints {
		report = append(report, l.Error())
	}
	joined := strings.Join(report, "\n")
	for _, field := range []string{"consumer_grop", "topik"} {
		if !strings.Contains(joined, field) {
			t.Errorf("lint report does not name %q:\n%s", field, joined)
		}
	}

	// The same through the CLI that `forwarder lint` runs.
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(lintGood), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(lintBad), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runLintCLI(t, good); code != 0 {
		t.Fatalf("lint of the good config exited %d:\n%s", code, out)
	}
	code, out := runLintCLI(t, bad)
	if code != 1 {
		t.Fatalf("lint of the bad config exited %d, want 1:\n%s", code, out)
	}
	for _, field := range []string{"consumer_grop", "topik"} {
		if !strings.Contains(out, field) {
			t.Errorf("lint output does not name %q:\n%s", field, out)
		}
	}
}

// runLintCLI runs `forwarder lint path` in-process and returns its exit
// code and what it wrote to stderr.
func runLintCLI(t *testing.T, path string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	read := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	code, runErr := service.RunCLIToCode(context.Background(), service.CLIOptSetArgs("forwarder", "lint", path))
	os.Stderr = saved
	_ = w.Close()
	out := <-read
	_ = r.Close()
	if runErr != nil {
		t.Fatalf("running lint: %v", runErr)
	}
	return code, out
}
