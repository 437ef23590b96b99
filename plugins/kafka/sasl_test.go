package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// saslPassword holds the characters that YAML and ${VAR} interpolation
// would break or cut; the plugin reads it from the environment as is.
const saslPassword = `p#w: *x !y [z %q 'é"`

// TestSASLPasswordFromEnvironment: a SASL password is read from the
// variable password_env names, whatever characters it holds, and the
// broker accepts it.
func TestSASLPasswordFromEnvironment(t *testing.T) {
	t.Setenv("TEST_KAFKA_SASL_PASSWORD", saslPassword)
	c := kafkatest.New(t, nil,
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "forwarder", saslPassword),
		kfake.SeedTopics(1, "sasl-topic"))

	produce := startOutput(t, `
seed_brokers: [ "`+c.Brokers()+`" ]
topic: sasl-topic
sasl:
  - mechanism: SCRAM-SHA-256
    username: forwarder
    password_env: TEST_KAFKA_SASL_PASSWORD
`)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := produce(ctx, service.MessageBatch{service.NewMessage([]byte("hello"))}); err != nil {
		t.Fatalf("produce with the password from the environment: %v", err)
	}

	read := func(pass string, within time.Duration) ([]*kgo.Record, error) {
		cl := c.Client(t,
			kgo.SASL(scram.Auth{User: "forwarder", Pass: pass}.AsSha256Mechanism()),
			kgo.ConsumeTopics("sasl-topic"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		f := cl.PollFetches(ctx)
		return f.Records(), f.Err()
	}
	recs, err := read(saslPassword, waitTimeout)
	if err != nil || len(recs) != 1 || string(recs[0].Value) != "hello" {
		t.Fatalf("reading back with the right password: %d records, %v", len(recs), err)
	}
	// The broker really checks the password: the test would pass for
	// nothing otherwise.
	if recs, err := read("wrong", 2*time.Second); err == nil && len(recs) > 0 {
		t.Fatalf("a wrong password read %d records", len(recs))
	}
}

// TestSASLPasswordMissing: a mechanism without a password fails start-up
// with the variable to set, not with an authentication error later.
func TestSASLPasswordMissing(t *testing.T) {
	t.Setenv("TEST_KAFKA_SASL_UNSET", "")
	spec := service.NewConfigSpec().Field(saslField())
	conf, err := spec.ParseYAML(`
sasl:
  - mechanism: PLAIN
    username: forwarder
    password_env: TEST_KAFKA_SASL_UNSET
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = parseSASL(conf)
	if err == nil || !strings.Contains(err.Error(), "set the environment variable TEST_KAFKA_SASL_UNSET") {
		t.Fatalf("err = %v, want one naming TEST_KAFKA_SASL_UNSET", err)
	}
}
