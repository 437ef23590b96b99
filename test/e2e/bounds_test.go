package e2e_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
)

// TestSettingsAtTheirBounds runs the shipped pipeline with every count and
// size of delivery at the smallest value start-up accepts, then at the
// largest, on a backlog with Kafka duplicates, malformed messages, messages
// without a messageId and berth pairs (ordering on): every configuration
// start-up accepts delivers (docs/guarantees.md #12). Each bound has its
// own unit test where it is parsed; this is the whole pipeline with all of
// them at once, where one setting's extreme meets another's: one row
// claimed, held and sent at a time behind a byte budget of one byte; or
// claims, direct dispatch and requests with no limit but the backlog.
func TestSettingsAtTheirBounds(t *testing.T) {
	scenario(t, light, 15*time.Second)
	maxInt := strconv.FormatInt(math.MaxInt64, 10)
	for _, c := range []struct {
		name string
		env  map[string]string
		n    int
		// maxInFlight is the most requests the platform may see at once
		// (one row held by OUTBOX_MAX_UNACKED and by a byte budget of one
		// byte, one request by FORWARD_MAX_IN_FLIGHT: any of them holds
		// it); 0 for no bound but the backlog.
		maxInFlight int64
	}{
		{"Smallest", map[string]string{
			"OUTBOX_BATCH_SIZE":         "1",
			"OUTBOX_MAX_UNACKED":        "1",
			"OUTBOX_MAX_UNACKED_DIRECT": "0",
			"OUTBOX_MAX_UNACKED_BYTES":  "1",
			"FORWARD_MAX_IN_FLIGHT":     "1",
			"FORWARD_MAX_ATTEMPTS":      "1",
			"KAFKA_BATCH_PERIOD":        "0s",
			"FORWARD_RETRY_INITIAL":     "0s",
			"FORWARD_RETRY_MAX":         "0s",
		}, load(800, 300), 1},
		{"Largest", map[string]string{
			"OUTBOX_BATCH_SIZE":         maxInt,
			"OUTBOX_MAX_UNACKED":        maxInt,
			"OUTBOX_MAX_UNACKED_DIRECT": maxInt,
			"OUTBOX_MAX_UNACKED_BYTES":  "4EiB",
			"FORWARD_MAX_IN_FLIGHT":     strconv.Itoa(pluginconf.MaxInFlight),
			"FORWARD_MAX_ATTEMPTS":      strconv.Itoa(outboxdb.MaxAttemptsLimit),
			"KAFKA_BATCH_PERIOD":        "1s",
		}, load(4000, 1000), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, stackOptions{
				env: c.env,
				// A platform that takes its time, so that requests overlap
				// and rows wait behind them.
				faults: mockplatform.Faults{Latency: 2 * time.Millisecond, LatencyJitter: 8 * time.Millisecond},
			})
			s.produce(s.newSource(eventgen.SourceConfig{
				DuplicateRate: 0.02, MalformedRate: 0.02, MissingIDRate: 0.02, Berths: 40,
			}), c.n)
			start := time.Now()
			s.start("forwarder", nil)
			s.waitSettled(3 * time.Minute)
			r := s.verify()
			if r.dupDeliveries > 0 {
				t.Errorf("%d messages were delivered more than once:%s", r.dupMessages, s.dupHistory(r))
			}
			if c.maxInFlight > 0 && r.peakInFlight > c.maxInFlight {
				t.Errorf("the platform saw %d requests at once, want at most %d", r.peakInFlight, c.maxInFlight)
			}
			t.Logf("%s settings: %s; settled %s after start", c.name, r, time.Since(start).Round(time.Millisecond))
		})
	}
}
