// Package kafka holds the kafka_franz input and output, built on franz-go.
//
// The input is an at-least-once consumer group member: an offset is
// committed only once the record at it and every earlier record of its
// partition have been acknowledged by the pipeline (see checkpoint.go).
//
// # Why not more of an existing consumer
//
// Benthos core has no Kafka input. Redpanda Connect's kafka_franz, whose
// field names we keep so that configs move over, is Apache-2.0, but it
// lives in a large module that also holds code under the Redpanda Community
// License and pins its own Benthos release, and it does not do what the
// outbox needs: without a batching policy it hands out one record per
// batch (one database statement per message), it has no byte budget, and
// it commits through franz-go's autocommit of marked records.
//
// franz-go (kgo) gives us the consumer group protocol (joins, cooperative
// rebalances, heartbeats, static membership), fetching with its own
// buffering limits, decompression of every codec, offset commits ordered
// one after another, and the rebalance callbacks. Its autocommit commits
// what was polled or marked; knowing which records are safe to commit is
// ours. What this package adds on top:
//
//   - per-partition ack tracking: acks arrive in any order, and only the
//     acked prefix of each partition is committed (checkpoint.go);
//   - commits at commit_period, synchronously in OnPartitionsRevoked so the
//     next owner starts where we stopped (bounded, so a commit the broker
//     does not answer cannot keep the member past the rebalance timeout),
//     and at Close before leaving the group; lost partitions are forgotten
//     without a commit;
//   - back-pressure by records (checkpoint_limit per partition) and by
//     bytes (max_buffered_bytes over all partitions), by not polling;
//   - batches that carry every partition's records, so a processor that
//     writes one statement per batch sees them together;
//   - the per-partition lag gauge, and broker outages logged once;
//   - a decompressor bounded by max_message_bytes whose refusals franz-go
//     reports with the batch's offsets, so that a batch it will not
//     decompress (a decompression bomb, a zstd window wider than the bound,
//     bytes that are not their codec's) is skipped and accounted for, not
//     fetched again forever (decompress.go).
//
// Rejected batches are replayed by Benthos's own service.AutoRetryNacksBatched,
// which calls the input's ack function only once a batch is delivered; a
// batching policy is Benthos's service.Batcher over what the input hands
// out.
package kafka
