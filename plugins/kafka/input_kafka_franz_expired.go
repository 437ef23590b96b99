package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// metricRecordsExpired counts the offsets Kafka deleted before the group
// read them: one record each, but for the offsets a transactional
// producer's markers took or compaction had already emptied, so the count
// is an upper bound on the messages lost.
const metricRecordsExpired = "forwarder_kafka_records_expired_total"

// expiredCheckTimeout bounds the look at the log starts once a group's
// offsets are fetched: it may delay consuming, never stop it.
const expiredCheckTimeout = 5 * time.Second

// franzOutOfRange starts the warning franz-go logs when the offset a
// partition was being read at has been deleted (kgo/source.go); its fields
// name the topic, the partition and that offset (prior_offset). franz-go
// then resumes at the log start and reports nothing else.
const franzOutOfRange = "received OFFSET_OUT_OF_RANGE while consuming"

// expiredCheck finds the records Kafka deleted (its retention ran out)
// before the group read them. Nothing can bring those messages back, but
// they must not vanish unseen: each such partition is logged at ERROR with
// the range lost and counted. Two ways it happens:
//
//   - at assignment, a committed offset below the partition's log start
//     (the forwarder was stopped longer than the retention): adjust moves
//     the fetch to the log start, whatever start_from_oldest says (it is for
//     a group without a commit);
//   - while a partition is read, the retention overtakes the consumer:
//     franz-go logs franzOutOfRange and resumes at the log start by itself;
//     outOfRange keeps the offset it was at and resumed measures the gap
//     from the first record read after it.
type expiredCheck struct {
	log   *service.Logger
	group string
	// lost counts the offsets deleted before they were read.
	lost *service.MetricCounter
	// client is the group's client, kept by the assignment callback that
	// franz-go runs just before adjust.
	client atomic.Pointer[kgo.Client]

	// skipped holds, per partition, the offset being read when franz-go
	// found it deleted, until a record at or past it is read; waiting
	// counts its entries, so that a poll without one costs a load.
	mu      sync.Mutex
	skipped map[topicPartition]int64
	waiting atomic.Int32
}

// assigned keeps the client for adjust (kgo.OnPartitionsAssigned).
func (e *expiredCheck) assigned(cl *kgo.Client) { e.client.Store(cl) }

// adjust is the group's kgo.AdjustFetchOffsetsFn: offsets are the committed
// offsets (or the reset offset, for a partition without a commit).
func (e *expiredCheck) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	cl := e.client.Load()
	if cl == nil || len(offsets) == 0 {
		return offsets, nil
	}
	topics := slices.Sorted(maps.Keys(offsets))
	cctx, cancel := context.WithTimeout(ctx, expiredCheckTimeout)
	defer cancel()
	starts, err := kadm.NewClient(cl).ListStartOffsets(cctx, topics...)
	// A broker that does not answer fails its share of the listing only
	// (*kadm.ShardErrors): the partitions of the others are still checked.
	var shards *kadm.ShardErrors
	if err != nil && (!errors.As(err, &shards) || shards.AllFailed) {
		e.warnUnchecked(topics, err)
		return offsets, nil
	}
	var unchecked []string
	for topic, parts := range offsets {
		for p, o := range parts {
			committed := o.EpochOffset().Offset
			if committed < 0 {
				continue
			}
			start, ok := starts.Lookup(topic, p)
			if !ok || start.Err != nil {
				unchecked = append(unchecked, fmt.Sprintf("%s[%d]", topic, p))
				if err == nil {
					err = start.Err
				}
				continue
			}
			if start.Offset <= committed {
				continue
			}
			lost := start.Offset - committed
			e.lost.Incr(lost)
			e.log.Errorf("kafka_franz: %s[%d]: Kafka deleted offsets %d to %d before group %q read them (the topic's retention ran out): up to %d messages never reached the outbox; consuming resumes at %d",
				topic, p, committed, start.Offset-1, e.group, lost, start.Offset)
			parts[p] = kgo.NewOffset().At(start.Offset)
		}
	}
	if len(unchecked) > 0 {
		slices.Sort(unchecked)
		e.warnUnchecked(unchecked, err)
	}
	return offsets, nil
}

// warnUnchecked says which topics or partitions could not be checked: their
// consumption goes on from the committed offset, and records deleted below
// it would pass with franz-go's reset alone.
func (e *expiredCheck) warnUnchecked(what []string, cause error) {
	if cause == nil {
		cause = errors.New("the brokers did not list them")
	}
	e.log.Warnf("kafka_franz: could not read the log start of %s to check for records deleted before group %q read them: %v", strings.Join(what, ", "), e.group, cause)
}

// outOfRange notes that franz-go found the offset prior of a partition
// deleted while reading it (franzOutOfRange, through kgoLogger).
func (e *expiredCheck) outOfRange(topic string, partition int32, prior int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.skipped == nil {
		e.skipped = make(map[topicPartition]int64)
	}
	tp := topicPartition{topic, partition}
	if _, ok := e.skipped[tp]; !ok {
		e.waiting.Add(1)
	}
	e.skipped[tp] = prior
}

// resumed is told the first offset of each partition's records a poll
// returned. The first at or past the offset franz-go found deleted is where
// it resumed: the records in between never reached the outbox. Records
// below it were fetched before the reset and say nothing.
func (e *expiredCheck) resumed(topic string, partition int32, first int64) {
	if e.waiting.Load() == 0 {
		return
	}
	tp := topicPartition{topic, partition}
	e.mu.Lock()
	prior, ok := e.skipped[tp]
	if !ok || first < prior {
		e.mu.Unlock()
		return
	}
	delete(e.skipped, tp)
	e.waiting.Add(-1)
	e.mu.Unlock()
	if lost := first - prior; lost > 0 {
		e.lost.Incr(lost)
		e.log.Errorf("kafka_franz: %s[%d]: Kafka deleted offsets %d to %d before group %q read them (the topic's retention overtook the consumer): up to %d messages never reached the outbox; consuming resumed at %d",
			topic, partition, prior, first-1, e.group, lost, first)
	}
}

// forget drops what outOfRange noted for partitions this member no longer
// reads: their next owner starts from the commit, and adjust checks it.
func (e *expiredCheck) forget(parts map[string][]int32) {
	if e.waiting.Load() == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if _, ok := e.skipped[tp]; ok {
				delete(e.skipped, tp)
				e.waiting.Add(-1)
			}
		}
	}
}
