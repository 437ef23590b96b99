package devstack

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

func TestProgressLinesFit80Columns(t *testing.T) {
	t.Parallel()
	header := FormatHeader()
	if n := utf8.RuneCountInString(header); n > 80 {
		t.Errorf("header is %d columns: %q", n, header)
	}
	// The largest values a long run at the highest rates reaches: 100
	// days at the default 100 msg/s, ten million rows behind.
	big := Progress{}
	big.Produced.Produced, big.Produced.Malformed = 99_999_999, 99_999
	big.Rows.Persisted, big.Rows.Delivered, big.Rows.Retrying, big.Rows.Failed = 99_999_999, 99_999_999, 9_999_999, 999_999
	big.Rows.Waiting = 9_999_999
	big.Platform.HTTP5xx = 999_999
	prev := big
	prev.Rows.Delivered -= 99_999
	line := FormatLine(99*time.Hour+59*time.Minute, big, prev, time.Second)
	if n := utf8.RuneCountInString(line); n > 80 {
		t.Errorf("a progress line is %d columns:\n%s\n%s", n, header, line)
	}
	// Every value ends under the end of its header.
	small := FormatLine(3*time.Second, Progress{}, Progress{}, time.Second)
	if len(small) != len(header) {
		t.Errorf("columns do not line up:\n%s\n%s", header, small)
	}
	for i := range header {
		if header[i] != ' ' && (i+1 == len(header) || header[i+1] == ' ') && small[i] == ' ' {
			t.Errorf("column ending at %d is empty:\n%s\n%s", i, header, small)
		}
	}
}

func TestParseLogfmt(t *testing.T) {
	t.Parallel()
	line := `time="2026-12-01T19:40:03Z" level=error msg="Rejected the edit: compiling m.blobl:3:7: expected \"x\"" @service=benthos error="compiling m.blobl:3:7: expected \"x\"" mapping_file=mappings/v.blobl mapping_reload=rejected`
	f := parseLogfmt(line)
	for k, want := range map[string]string{
		"level": "error", "mapping_reload": "rejected", "mapping_file": "mappings/v.blobl",
		"error": `compiling m.blobl:3:7: expected "x"`, "@service": "benthos",
	} {
		if f[k] != want {
			t.Errorf("%s = %q, want %q", k, f[k], want)
		}
	}
}

// TestScreenShowsReloadsAndRebalances runs the stack as `make run` does, in
// a copy of the repository's pipeline and mappings, and watches its screen:
// a broken edit of a mapping is shown rejected with the file, line and
// column and that the previous version still serves, a fixed one reloaded;
// a consumer that joins the stack's group (as a forwarder started by hand
// with its KAFKA_GROUP would) makes the stack's forwarder give up
// partitions, and the screen says so with the group's member count. Every
// progress line fits 80 columns, under a header.
func TestScreenShowsReloadsAndRebalances(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	work := t.TempDir()
	for _, dir := range []string{"pipelines", "mappings"} {
		if err := os.CopyFS(filepath.Join(work, dir), os.DirFS(filepath.Join(root, dir))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Dir: t.TempDir(), WorkDir: work, Forwarder: bin, HTTPAddr: "127.0.0.1:0", Rate: 20, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.env["KAFKA_GROUP"] != Group || Group == "forwarder" {
		t.Fatalf("the stack's forwarder uses group %q: a forwarder started by hand with the defaults would join it", s.env["KAFKA_GROUP"])
	}

	var screen logbuf.Buffer
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx, 0, &screen) }()
	// waitScreen waits for re on the screen after what the last wait saw.
	seen := 0
	waitScreen := func(what string, re *regexp.Regexp) {
		t.Helper()
		for {
			if loc := re.FindStringIndex(screen.String()[seen:]); loc != nil {
				seen += loc[1]
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the screen never showed %s (%s) after:\n%s", what, re, screen.String()[:seen])
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitScreen("the first progress line", regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d +\d+ +\d+`))

	mappingFile := filepath.Join(work, "mappings", "vehicle_event.blobl")
	good, err := os.ReadFile(mappingFile)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(good), "root.park_code = ", "root.park_code = +++ ", 1)
	line := 1 + strings.Count(broken[:strings.Index(broken, "+++")], "\n")
	writeFile := func(content string) {
		t.Helper()
		tmp := mappingFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, mappingFile); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(broken)
	waitScreen("the broken edit rejected", regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  mapping mappings/vehicle_event\.blobl rejected: compiling mappings/vehicle_event\.blobl:`+
		strconv.Itoa(line)+`:\d+: [^\n]*; still serving the previous version$`))
	writeFile(string(good) + "\n# fixed\n")
	waitScreen("the fixed edit reloaded", regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  mapping mappings/vehicle_event\.blobl reloaded \(sha256 [0-9a-f]{12}\)$`))

	// Another member of the stack's group.
	intruder, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...), kgo.ConsumerGroup(Group),
		kgo.ConsumeTopics(eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close()
	go func() {
		for ctx.Err() == nil && !intruder.PollFetches(ctx).IsClientClosed() {
		}
	}()
	waitScreen("the partitions given up, and why", regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  kafka: the forwarder gave up device-[^\n]*; group `+
		Group+` has 2 members, 1 more than the dev stack started \(a forwarder started by hand with KAFKA_GROUP=`+Group+`\?\)$`))
	intruder.Close()
	waitScreen("the partitions taken back", regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  kafka: the forwarder now consumes device-[^\n]*; group `+Group+` has 1 member$`))

	stopRun()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	out := screen.String()
	if !strings.HasPrefix(out, FormatHeader()+"\n") {
		t.Errorf("the screen does not start with the header:\n%s", out)
	}
	progress := regexp.MustCompile(`^\d\d:\d\d:\d\d +\d`)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if progress.MatchString(l) && utf8.RuneCountInString(l) > 80 {
			t.Errorf("a progress line is wider than 80 columns: %q", l)
		}
	}
	t.Logf("screen:\n%s", out)
}
