package devstack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// External is where the parts of the stack that are not embedded run, and
// how the mock platform is reached (Config.External).
type External struct {
	// Brokers are Kafka's seed brokers. Both topics are created there with
	// KafkaPartitions partitions when they do not exist.
	Brokers []string
	// DatabaseURL is the forwarder's database. The stack migrates it (safe
	// while a forwarder does the same) and reads its progress lines from it.
	DatabaseURL string
	// PlatformAddr is where the mock platform listens, e.g. 0.0.0.0:8080
	// in a container. Default 127.0.0.1:8080.
	PlatformAddr string
	// AccessName and AccessPwd are the credentials the mock platform
	// accepts: the forwarder's PLATFORM_ACCESS_NAME and PLATFORM_ACCESS_PWD.
	AccessName, AccessPwd string
}

// DefaultPlatformAddr is External.PlatformAddr's default.
const DefaultPlatformAddr = "127.0.0.1:8080"

// startExternal is Start with Config.External: it waits for Kafka and
// PostgreSQL to answer (they may start after us), then serves the mock
// platform and runs the generator.
func startExternal(ctx context.Context, cfg Config) (s *Stack, err error) {
	ext := *cfg.External
	switch {
	case len(ext.Brokers) == 0:
		return nil, errors.New("devstack: no Kafka brokers given for the external stack (-kafka-brokers)")
	case ext.DatabaseURL == "":
		return nil, errors.New("devstack: no database given for the external stack (-database-url or DATABASE_URL)")
	case ext.AccessName == "" || ext.AccessPwd == "":
		return nil, errors.New("devstack: the mock platform needs the forwarder's credentials: set PLATFORM_ACCESS_NAME and PLATFORM_ACCESS_PWD")
	}
	ext.PlatformAddr = orDefault(ext.PlatformAddr, DefaultPlatformAddr)

	s = &Stack{cfg: cfg, DatabaseURL: ext.DatabaseURL, Brokers: ext.Brokers}
	defer func() {
		if err != nil {
			_ = s.Stop()
			s = nil
		}
	}()

	cfg.Logf("waiting for PostgreSQL")
	if err = retry(ctx, "connecting to PostgreSQL", cfg.Logf, func() error {
		pool, err := outboxdb.Open(ctx, ext.DatabaseURL, outboxdb.PoolConfig{MaxConns: 4, ApplicationName: "forwarder-devstack"})
		if err != nil {
			return err
		}
		s.pool = pool
		return nil
	}); err != nil {
		return s, err
	}
	if err = s.markStart(ctx); err != nil {
		return s, err
	}

	cfg.Logf("waiting for Kafka on %s", strings.Join(ext.Brokers, ","))
	if err = retry(ctx, "creating the topics", cfg.Logf, func() error {
		return ensureTopics(ctx, ext.Brokers, eventgen.DefaultVehicleTopic, eventgen.DefaultHeartbeatTopic)
	}); err != nil {
		return s, err
	}

	if s.Platform, err = mockplatform.StartAt(ext.PlatformAddr, mockplatform.Config{
		AccessName: ext.AccessName, AccessPwd: ext.AccessPwd, Faults: cfg.Faults,
	}); err != nil {
		return s, err
	}
	cfg.Logf("mock platform on %s", s.Platform.Addr)
	return s, s.startGenerator(ctx)
}

// ensureTopics creates the topics with KafkaPartitions partitions unless
// they exist (a broker that auto-creates topics would give them one).
func ensureTopics(ctx context.Context, brokers []string, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("forwarder-devstack"))
	if err != nil {
		return err
	}
	defer cl.Close()
	reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// -1: the broker's default replication factor.
	resps, err := kadm.NewClient(cl).CreateTopics(reqCtx, KafkaPartitions, -1, nil, topics...)
	if err != nil {
		return err
	}
	for _, r := range resps {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// retry calls fn every second until it succeeds or ctx ends, reporting
// the first failure and every tenth.
func retry(ctx context.Context, what string, logf func(string, ...any), fn func() error) error {
	for i := 0; ; i++ {
		err := fn()
		if err == nil {
			return nil
		}
		if i%10 == 0 {
			logf("%s: %v (retrying)", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (gave up: %v)", what, err, context.Cause(ctx))
		case <-time.After(time.Second):
		}
	}
}
