package devstack

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// TestExternal is the compose stack's devstack (deploy/compose): only the
// mock platform and the generator, against a Kafka and a PostgreSQL that
// run elsewhere. The topics are created on that Kafka, the generator
// produces there, a real forwarder configured like the compose file's
// delivers to the mock platform with the shared credentials, the progress
// comes from that database, and nothing is written locally.
func TestExternal(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	bin := buildForwarder(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// "Elsewhere": a PostgreSQL (an embedded stack's, nothing else of it
	// used) and a Kafka broker without the topics.
	pg, err := Start(ctx, Config{Dir: t.TempDir(), WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()

	t.Run("MissingCredentials", func(t *testing.T) {
		_, err := Start(ctx, Config{External: &External{Brokers: kafka.ListenAddrs(), DatabaseURL: pg.DatabaseURL, AccessName: "n"}})
		if err == nil || !strings.Contains(err.Error(), "PLATFORM_ACCESS_PWD") {
			t.Fatalf("Start without the platform password: %v, want an error naming PLATFORM_ACCESS_PWD", err)
		}
	})

	const n = 40
	dir := t.TempDir()
	s, err := Start(ctx, Config{
		Dir:   dir,
		Count: n,
		External: &External{
			Brokers:      kafka.ListenAddrs(),
			DatabaseURL:  pg.DatabaseURL,
			PlatformAddr: "127.0.0.1:0",
			AccessName:   "compose",
			AccessPwd:    "s3cret pwd",
		},
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.PG != nil || s.Kafka != nil || s.Forwarder != nil {
		t.Fatalf("the external stack embedded something: PG %v, Kafka %v, forwarder %v", s.PG, s.Kafka, s.Forwarder)
	}

	// The topics, created with the partitions the scale-out docs assume.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic} {
		if td, ok := topics[name]; !ok || len(td.Partitions) != KafkaPartitions {
			t.Errorf("topic %s on the external broker: %+v, want %d partitions", name, td, KafkaPartitions)
		}
	}

	// A forwarder wired like the compose file's: the stack's Kafka,
	// database and platform, the credentials the platform was given.
	var logs bytes.Buffer
	fwd, err := startForwarder(ctx, bin, DefaultPipeline, root, map[string]string{
		"KAFKA_BROKERS":         strings.Join(s.Brokers, ","),
		"DATABASE_URL":          s.DatabaseURL,
		"PLATFORM_URL":          s.Platform.URL,
		"PLATFORM_ACCESS_NAME":  "compose",
		"PLATFORM_ACCESS_PWD":   "s3cret pwd",
		"FORWARD_RETRY_INITIAL": "100ms",
	}, ForwarderOptions{HTTPAddr: "127.0.0.1:0", Log: &logs})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	defer fwd.Stop(DefaultShutdownTimeout)

	want := func(st mockplatform.Stats) bool {
		return st.Accepted == s.Generator.Stats().Deliverable && s.Generator.Stats().Produced == n
	}
	if err := s.Platform.WaitFor(ctx, want); err != nil {
		t.Fatalf("%v: platform %+v, generator %+v\nforwarder log:\n%s", err, s.Platform.Stats(), s.Generator.Stats(), tail(logs.String(), 3000))
	}
	if st := s.Platform.Stats(); st.AuthFailures != 0 {
		t.Errorf("the mock platform refused the forwarder's credentials %d times", st.AuthFailures)
	}

	var out bytes.Buffer
	if err := s.Run(ctx, 1500*time.Millisecond, &out); err != nil {
		t.Fatal(err)
	}
	p, err := s.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Rows.Persisted != s.Generator.Stats().Rows() || !regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d +\d+ +\d+`).MatchString(out.String()) {
		t.Errorf("progress %+v from the external database, want %d rows; output:\n%s", p.Rows, s.Generator.Stats().Rows(), out.String())
	}

	if err := fwd.Stop(DefaultShutdownTimeout); err != nil {
		t.Error(err)
	}
	if err := s.Stop(); err != nil {
		t.Error(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("the external stack wrote to its Dir: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(dir, "pg")); !os.IsNotExist(err) {
		t.Errorf("the external stack created a PostgreSQL cluster: %v", err)
	}
}
