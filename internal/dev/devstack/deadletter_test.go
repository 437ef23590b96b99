package devstack

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// TestDeadLetterExampleRuns follows docs/operations.md, "On the dev stack":
// pipelines/examples/dead_letter.yaml, pointed at the stack's database and
// broker, publishes a FAILED row to the topic the stack created.
func TestDeadLetterExampleRuns(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{Dir: t.TempDir(), WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()

	fixture.New(t, s.Pool()).Insert(fixture.Row{
		Key: "dead-1", Status: "FAILED", Offset: 7, Payload: []byte(`{"messageId":"dead-1"}`),
		LastError: "mapping: inoutType 7 is not 0 or 1", Attempts: 1,
	})

	addr, err := childproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := t.TempDir() + "/dead_letter.log"
	logs, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	p, err := childproc.Start(childproc.Spec{
		Path: bin, Args: []string{"-c", "pipelines/examples/dead_letter.yaml"}, Dir: root,
		Environ: os.Environ(),
		Env: map[string]string{
			"DATABASE_URL": s.DatabaseURL, "KAFKA_BROKERS": strings.Join(s.Brokers, ","),
			"DEAD_LETTER_HTTP_ADDR": addr, "DEAD_LETTER_POLL_INTERVAL": "200ms",
		},
		Output: logs, ParentDeath: syscall.SIGKILL,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("dead-letter pipeline exit: %v\n%s", err, childproc.TailFile(logPath, 3000))
		}
	}()

	consumer, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...), kgo.ConsumeTopics(DeadLetterTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	for {
		fetches := consumer.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("nothing published to %s: %v\n%s", DeadLetterTopic, ctx.Err(), childproc.TailFile(logPath, 3000))
		}
		for _, r := range fetches.Records() {
			headers := map[string]string{}
			for _, h := range r.Headers {
				headers[h.Key] = string(h.Value)
			}
			if string(r.Key) != "dead-1" || headers["reason"] != "mapping: inoutType 7 is not 0 or 1" {
				t.Fatalf("record key %q headers %v, want dead-1 with its reason", r.Key, headers)
			}
			return
		}
	}
}
