package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// metricRecordsExpired counts the records Kafka deleted before the group
// read them.
const metricRecordsExpired = "forwarder_kafka_records_expired_total"

// expiredCheckTimeout bounds the look at the log starts once a group's
// offsets are fetched: it may delay consuming, never stop it.
const expiredCheckTimeout = 5 * time.Second

// expiredCheck finds the records of newly assigned partitions that Kafka
// deleted (its retention ran out) before the group read them: a committed
// offset below the partition's log start. Nothing can bring those messages
// back, but they must not vanish unseen: each such partition is logged at
// ERROR with the range lost and counted, and consuming resumes at the log
// start, whatever start_from_oldest says (it is for a group without a
// commit).
type expiredCheck struct {
	log   *service.Logger
	group string
	// lost counts the records deleted before they were read.
	lost *service.MetricCounter
	// client is the group's client, kept by the assignment callback that
	// franz-go runs just before adjust.
	client atomic.Pointer[kgo.Client]
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
			e.log.Errorf("kafka_franz: %s[%d]: Kafka deleted offsets %d to %d before group %q read them (the topic's retention ran out): %d messages never reached the outbox; consuming resumes at %d",
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
