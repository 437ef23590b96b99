package outboxretry

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/internal/streamdb"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	orFieldBatchSize        = "batch_size"
	orFieldLease            = "lease"
	orFieldPollInterval     = "poll_interval"
	orFieldInstanceID       = "instance_id"
	orFieldMaxUnacked       = "max_unacked"
	orFieldMaxUnackedBytes  = "max_unacked_bytes"
	orFieldMaxUnackedDirect = "max_unacked_direct"
	orFieldMaxAttempts      = "max_attempts"
	orFieldNackDelay        = "nack_delay"
	orFieldOrderOnFailed    = "order_on_failed"
	orFieldPartitionWidth   = "partition_width"
	orFieldRetention        = "retention"
	orFieldRequeue          = "failed_requeue"
	orFieldRequeueAfter     = "after"
	orFieldRequeueRounds    = "rounds"

	orFieldRetentionOlderThan  = "older_than"
	orFieldRetentionInterval   = "interval"
	orFieldRetentionBatchSize  = "batch_size"
	orFieldRetentionForce      = "force"
	orFieldRetentionDeadLetter = "dead_letter"
)

var outboxRetrySpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Categories("Services").
		Summary("Claims due rows of the PostgreSQL outbox and emits them as messages, on any number of instances at once.").
		Description(`
The dispatcher of the forwarder. Each read claims up to `+"`batch_size`"+` due rows of
`+"`forward_records`"+` in one statement: `+"`PENDING`"+` rows whose `+"`next_retry_at`"+` has come and
`+"`IN_PROGRESS`"+` rows whose lease expired because their holder vanished, oldest due first,
with `+"`FOR UPDATE SKIP LOCKED`"+` so that instances never take the same row. A claimed row becomes
`+"`IN_PROGRESS`"+` with a fresh `+"`claim_token`"+`, a lease deadline and `+"`attempt_count + 1`"+`
(every claim counts as an attempt). A row whose lease expired leaves a `+"`LEASE_EXPIRED`"+` attempt
log; one that has already used its attempts is marked `+"`FAILED`"+` instead of being sent again,
so a message that crashes its holder every time still ends.

The message body is the stored payload, byte for byte. Metadata: `+"`outbox_id`"+`, `+"`message_key`"+`,
`+"`api_type`"+`, `+"`attempt`"+` (this attempt's number, 1-based), `+"`claim_token`"+`, `+"`kafka_topic`"+`,
`+"`kafka_partition`"+`, `+"`kafka_offset`"+`, `+"`kafka_key`"+`, `+"`outbox_created_at_ms`"+`,
`+"`lease_expires_at_ms`"+` and, on a retry of a failed attempt, `+"`previous_failure_at_ms`"+`
(when that attempt's result was written, on any instance; Unix milliseconds; not after a requeue).

### Leases

The input renews the leases of the rows it holds (waiting in the pipeline or in flight to the platform),
in one statement: every eighth of `+"`lease`"+` it renews those that end within half of it (four chances
before a lease runs out), so a row never loses its claim because the queue ahead of it
was long or the platform slow. The lease only bounds how long the rows of an instance that crashed stay
claimed. A held row whose claim was nevertheless lost (another instance took it after its lease ran out)
is not sent.

### Wake-up

The input LISTENs on the channel the `+"`outbox`"+` processor notifies when it commits new PENDING rows,
so such a row is claimed within milliseconds. It claims only while rows may be due: at start, after a
notification, after a claim that filled its batch, after a nack, and when the earliest `+"`next_retry_at`"+`
(a retry or a lease deadline, read once per idle period) or `+"`poll_interval`"+` comes; an `+"`http_forwarder`"+`
of the same stream announces the retries it schedules. A claim that finds fewer rows than it asked for
ends the claiming until one of these. The listening connection is re-established, with backoff, whenever
it is lost.

### Direct dispatch

An `+"`outbox`"+` processor of the same stream and database inserts new rows already claimed for this input,
as many as `+"`max_unacked`"+` and `+"`max_unacked_bytes`"+` leave room for, and hands them over in memory: they are
emitted like claimed rows (same metadata, attempt 1) without a claim statement, and counted in
`+"`forwarder_direct_rows_total`"+`. It hands over rows only while the input holds fewer than
`+"`max_unacked_direct`"+` (default: all of `+"`max_unacked`"+`): past that new rows are inserted `+"`PENDING`"+`,
where every instance's claims find them, so the instance that owns the busy Kafka partitions shares
their traffic with the others instead of queueing it all in its own memory. While due rows of the
database wait for room, no rows are handed over, so retries are not starved by new traffic.
While rows are leaving the input and no other instance has said it is idle, the processor waits up
to 50 ms for this room before it inserts rows `+"`PENDING`"+` (see the `+"`outbox`"+` processor's Direct
dispatch): a backlog is then handed over as it is delivered.
Components find each other through the stream's resources: two streams of one process never hand rows to each other. A stream may have one `+"`outbox_retry`"+` input per
database. The rows the `+"`http_forwarder`"+` output's result writes claim for this input, the next rows of the
keys they finish (see Ordering), are handed over the same way and counted there too.

### Acknowledgements

The output writes each row's outcome itself, fenced by `+"`outbox_id`"+` and `+"`claim_token`"+`, before it
acks. A row of an acknowledged batch that got no outcome had its message dropped on the way (a
processor deleted it, e.g. `+"`root = deleted()`"+` in a mapping): while the stream has an
`+"`http_forwarder`"+` output it becomes `+"`FAILED`"+` at once (failure class `+"`INVALID`"+`, never sent), rather than
coming back at every lease expiry until out of attempts. On a nack the batch's rows that are still held go back to `+"`PENDING`"+` at once (after
`+"`nack_delay`"+`), instead of waiting for the lease. On shutdown every claim not yet acknowledged is
released the same way, so a graceful stop leaves nothing `+"`IN_PROGRESS`"+`.

`+"`max_unacked`"+` and `+"`max_unacked_bytes`"+` bound the rows held: claimed or handed over and not yet
acknowledged. A single row larger than `+"`max_unacked_bytes`"+` is still taken, alone.

### Compensation

A row `+"`FAILED`"+` because its attempts ran out on transient or unavailable replies, or on claims whose holder
vanished (failure class `+"`TRANSIENT`"+`), is requeued `+"`failed_requeue.after`"+` after it failed, at most
`+"`failed_requeue.rounds`"+` times: back to `+"`PENDING`"+`, attempts reset, each round an attempt log with result status
`+"`REQUEUED`"+`. After the last round the row stays `+"`FAILED`"+` (frozen) for an operator. Rows the platform refused
for good (errcode 998, a `+"`no_retry`"+` rule: `+"`REJECTED`"+`) and bad input or mapping errors (`+"`INVALID`"+`) are never
requeued automatically. Instances share the work (`+"`FOR UPDATE SKIP LOCKED`"+`). Gauges
`+"`forwarder_compensation_waiting_rows`"+` (rows that will still be requeued) and `+"`forwarder_records_frozen`"+`, counter
`+"`forwarder_compensation_requeued_total`"+`.

### Ordering

Rows that the `+"`outbox`"+` processor stored with an ordering key (a berth, with `+"`ordering: berth`"+`) are
claimed one at a time per key, in the order they were persisted: a row waits, held, while an earlier row
of its key is unfinished (`+"`PENDING`"+`, waiting for a retry, or `+"`IN_PROGRESS`"+`), and is not even in the
index the claim reads, so a key with a long queue costs the claims of other keys nothing. When a row ends
`+"`SUCCESS`"+` the next one of its key is due at once. `+"`order_on_failed`"+` says what a row that ends
`+"`FAILED`"+` does: `+"`skip`"+` releases the next one (whose attempt log gets an `+"`ORDER_RELEASED`"+` row saying
why), `+"`block`"+` keeps the key held until an operator requeues the row (`+"`forwarder outbox requeue`"+`) or
releases the key (`+"`forwarder outbox release`"+`). The `+"`http_forwarder`"+` output of the same stream
applies it when it records results, and claims the row it releases for this input (chained dispatch: no
claim statement, no wake-up). Once a minute the input also looks for held rows whose key nothing
holds (which the database's lock protocol never leaves; a row changed by hand might), releases them,
logs them and counts them in `+"`forwarder_ordering_repairs_total`"+`.

### Partitions

Messages and their attempt logs are partitioned by creation time, `+"`partition_width`"+` wide (a day by
default). The input creates the partition of the current time and the three after it when it connects, and
keeps them ahead every quarter of a width (at most every hour), on every instance: the database creates each
partition once, and creating one does not stop inserts or claims. An insert that finds no partition for its
rows (no dispatcher has run for three widths) creates it itself.

### Retention

With `+"`retention.older_than`"+` set, the input also retires old partitions, once at start and then every
`+"`retention.interval`"+`: what `+"`forwarder outbox purge --older-than`"+` does. A partition whose range ended
longer ago than `+"`older_than`"+` is dropped whole, messages and attempt logs, when every message in it is
finished; the delivery rows of its `+"`FAILED`"+` messages go with it, and the operator log records it. A partition
holding a `+"`PENDING`"+` or `+"`IN_PROGRESS`"+` row, a `+"`FAILED`"+` row blocking its ordering key or, with
`+"`retention.dead_letter`"+`, a `+"`FAILED`"+` row not yet published to the dead-letter topic, stays whole. Retiring
a partition waits at most 100 ms at a time for its lock on the tables and holds it for milliseconds, so it
is safe while the service runs. Of several instances configured alike, one retires at a time: each run first
takes a PostgreSQL advisory lock (`+"`pg_try_advisory_lock`"+`) and skips its turn when another instance holds
it. What a run retired, and what it kept and why, is logged at INFO level.

A message that Kafka redelivers after its partition was retired is persisted and sent again (the platform
answers "duplicate"), so keep `+"`older_than`"+` longer than the topics' retention when that matters. An
`+"`older_than`"+` below a day is refused unless `+"`retention.force`"+` is true: redeliveries happen in
ordinary operation (a rebalance after a crash re-reads the offsets not yet committed).

### Metrics

`+"`forwarder_claimed_rows_total`"+` (counter), `+"`forwarder_claim_batch_size`"+` (gauge, rows taken
by the last claim), `+"`forwarder_direct_rows_total`"+`, `+"`forwarder_leases_renewed_total`"+` and
`+"`forwarder_claims_lost_total`"+` (held claims a renewal found taken by another instance) and
`+"`forwarder_ordering_repairs_total`"+` (held rows released by the ordering repair; expected 0).`).
		Fields(streamdb.DSNFields()...).
		Fields(
			service.NewIntField(orFieldBatchSize).
				Description("Most rows claimed by one statement and emitted as one batch.").
				Default(100).
				LintRule(fieldlint.Int(checkBatchSize)),
			service.NewDurationField(orFieldLease).
				Description("How long a claim owns its row without a result or a renewal (`CLAIM_LEASE`). The input renews the leases of the rows it holds, so this bounds how long the rows of a crashed instance wait before another takes them. Must exceed the output's request timeout (`FORWARD_TIMEOUT`); start-up says so otherwise.").
				Default("60s").
				Example("${CLAIM_LEASE:60s}").
				LintRule(fieldlint.Duration(orFieldLease, checkLease)),
			service.NewDurationField(orFieldPollInterval).
				Description("Longest sleep with nothing due. Only a fallback: new rows wake the input through LISTEN/NOTIFY and retries are awaited until their `next_retry_at`.").
				Default("5s").
				LintRule(fieldlint.Duration(orFieldPollInterval, checkPollInterval)),
			service.NewStringField(orFieldInstanceID).
				Description("Identifies this instance in `claimed_by` and in attempt logs. Empty: `<hostname>-<pid>`.").
				Default(""),
			service.NewIntField(orFieldMaxUnacked).
				Description("Most rows held (claimed or handed over, not yet acknowledged); the input stops claiming while it holds this many. Held rows keep their leases (they are renewed), so this bounds memory and the work a crash hands to other instances, not delivery.").
				Default(300).
				LintRule(fieldlint.Int(checkMaxUnacked)),
			service.NewIntField(orFieldMaxUnackedDirect).
				Description("Most rows held for direct dispatch to go on: while the input holds fewer, the stream's `outbox` processor inserts new rows already claimed for it; past it they are inserted `PENDING`, where every instance can claim them, so that the instance whose Kafka partitions bring the traffic does not keep it all to itself. `0`: `max_unacked`.").
				Default(0).
				LintRule(fieldlint.Int(checkMaxUnackedDirect)).
				Advanced(),
			service.NewStringField(orFieldMaxUnackedBytes).
				Description("Most payload bytes held, e.g. `64MiB`, at most `4EiB`; `0`: no byte bound. A row larger than this is still taken, alone, so with large messages the input holds at most this plus one message.").
				Default("64MiB").
				LintRule(fieldlint.String(func(s string) error { _, err := parseMaxUnackedBytes(s); return err })),
			service.NewIntField(orFieldMaxAttempts).
				Description("Attempts a row may use, from 1 to 2147483647. A due row that has already used them (its last holder vanished, or it was released on its last attempt) is marked `FAILED` instead of being sent again. When unset, the `retry.max_attempts` of the stream's `http_forwarder` output on the same database (else 5).").
				Optional().
				LintRule(fieldlint.Int(checkMaxAttempts)).
				Advanced(),
			service.NewDurationField(orFieldNackDelay).
				Description("How long a nacked row waits before it is due again. `0s`: at once.").
				Default("0s").
				LintRule(fieldlint.Duration(orFieldNackDelay, checkNackDelay)).
				Advanced(),
			service.NewObjectField(orFieldRequeue,
				service.NewDurationField(orFieldRequeueAfter).
					Description("How long after its failure a row FAILED on transient errors is requeued (`FAILED_REQUEUE_AFTER`); `0s`: never.").
					Default("1h").
					Example("${FAILED_REQUEUE_AFTER:1h}").
					LintRule(fieldlint.Duration(orFieldRequeue+"."+orFieldRequeueAfter, func(time.Duration) error { return nil })),
				service.NewIntField(orFieldRequeueRounds).
					Description("At most this many automatic requeues of a row (`FAILED_REQUEUE_ROUNDS`); `0`: none; at most 2147483647.").
					Default(3).
					Example("${FAILED_REQUEUE_ROUNDS:3}"),
			).
				Description("Automatic compensation (see Compensation above).").
				LintRule(fieldlint.Rule(lintRequeue)),
			service.NewStringAnnotatedEnumField(orFieldOrderOnFailed, map[string]string{
				string(outboxdb.OrderSkip):  "A row that ends FAILED releases the next row of its ordering key; the released row's attempt log says so (ORDER_RELEASED).",
				string(outboxdb.OrderBlock): "A row that ends FAILED keeps its ordering key blocked until an operator requeues it (`forwarder outbox requeue`) or releases the key (`forwarder outbox release`).",
			}).
				Description("What a row with an ordering key (see Ordering) that ends `FAILED` does to the later rows of its key (`ORDER_ON_FAILED`).").
				Default(string(outboxdb.OrderSkip)).
				Example("${ORDER_ON_FAILED:skip}").
				LintRule(fieldlint.Exact([]string{string(outboxdb.OrderSkip), string(outboxdb.OrderBlock)},
					func(s string) error { _, err := parseOrderOnFailed(s); return err })),
			service.NewStringField(orFieldPartitionWidth).
				Description("Width of the time partitions of messages and attempt logs (`OUTBOX_PARTITION`; see Partitions): a whole number of hours from `1h` to `7d`, Go duration syntax plus days. Retention retires whole partitions, so this is its granularity.").
				Default("1d").
				Examples("${OUTBOX_PARTITION:1d}", "6h").
				LintRule(fieldlint.String(func(s string) error { _, err := parsePartitionWidth(s); return err })),
			service.NewObjectField(orFieldRetention,
				service.NewStringField(orFieldRetentionOlderThan).
					Description("Retires the partitions whose range ended longer ago than this, when every message in them is finished (see Retention). Go duration syntax plus days (`7d`, `36h`, `1d12h`). Empty: no retention.").
					Default("").
					Examples("7d", "${OUTBOX_RETENTION:}"),
				service.NewStringField(orFieldRetentionInterval).
					Description("Time between two cleaning runs; the first runs when the input connects. Go duration syntax plus days.").
					Default("1h"),
				service.NewIntField(orFieldRetentionBatchSize).
					Description("Ignored: partitions are retired whole (accepted so that older configs still run).").
					Default(outboxdb.DefaultAdminBatchSize).
					Deprecated(),
				service.NewBoolField(orFieldRetentionForce).
					Description("Accept an `older_than` below the safe minimum of a day. A delivered row's key is what makes a Kafka redelivery of its message harmless; a message redelivered after its partition is retired is sent to the platform again.").
					Default(false).
					Advanced(),
				service.NewBoolField(orFieldRetentionDeadLetter).
					Description("The dead-letter topic is in use (`OUTBOX_RETENTION_DEAD_LETTER`): a partition holding a `FAILED` row not yet published to it stays until it is. Leave it off without a dead-letter publisher, or such partitions would stay for ever.").
					Default(false).
					Example("${OUTBOX_RETENTION_DEAD_LETTER:false}").
					Advanced(),
			).
				Description("Optional retention of old partitions (see Retention above). Off unless `older_than` is set.").
				LintRule(fieldlint.Rule(lintRetention)),
		).
		Example("Dispatcher", "Claims due rows and hands them to the mapping and the HTTP output. The database comes from `DATABASE_URL`.", `
input:
  outbox_retry:
    batch_size: 100
    lease: ${CLAIM_LEASE:60s}
    poll_interval: 5s
    max_unacked: 300
`).
		Example("Dispatcher with retention", "Also retires the days that ended more than a week ago and are finished, checking every hour; one instance retires at a time.", `
input:
  outbox_retry:
    partition_width: 1d
    retention:
      older_than: 7d
      interval: 1h
`)
})

func init() {
	service.MustRegisterBatchInput("outbox_retry", outboxRetrySpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
			return newOutboxRetryFromParsed(conf, mgr)
		})
}

// parseBytes reads a byte size such as "64MiB" or "0" (no limit).
func parseBytes(s string) (int64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte size such as 64MiB", s)
	}
	if n > outboxdb.MaxByteBudget {
		return 0, fmt.Errorf("%q is more than 4EiB, the largest budget", s)
	}
	return int64(n), nil
}

// parseRetention reads the retention block; nil when older_than is empty.
func parseRetention(conf *service.ParsedConfig) (*retentionConfig, error) {
	var err error
	olderThan := pluginconf.Field(&err, conf.FieldString, orFieldRetentionOlderThan)
	force := pluginconf.Field(&err, conf.FieldBool, orFieldRetentionForce)
	interval := pluginconf.Field(&err, conf.FieldString, orFieldRetentionInterval)
	deadLetter := pluginconf.Field(&err, conf.FieldBool, orFieldRetentionDeadLetter)
	if err != nil || olderThan == "" {
		return nil, err
	}
	rc, err := checkRetention(olderThan, force, interval)
	if err != nil {
		return nil, err
	}
	rc.DeadLetter = deadLetter
	return &rc, nil
}

// checkRetention checks the fields of a retention block whose older_than
// is set, for start-up and for lint.
func checkRetention(olderThan string, force bool, interval string) (rc retentionConfig, err error) {
	field := func(name string) string { return orFieldRetention + "." + name }
	if rc.OlderThan, err = outboxdb.ParseDuration(olderThan); err != nil {
		return rc, fmt.Errorf("field %s: %w", field(orFieldRetentionOlderThan), err)
	}
	if rc.OlderThan < outboxdb.MinPurgeAge && !force {
		return rc, fmt.Errorf("field %s: %s is below the safe minimum of %s: a delivered row's key is what makes "+
			"a Kafka redelivery of its message harmless, and a message redelivered after its partition is retired is "+
			"sent to the platform again; set it to %s or more, or %s: true to accept it",
			field(orFieldRetentionOlderThan), olderThan, outboxdb.FormatDuration(outboxdb.MinPurgeAge),
			outboxdb.FormatDuration(outboxdb.MinPurgeAge), field(orFieldRetentionForce))
	}
	if rc.Interval, err = outboxdb.ParseDuration(interval); err != nil {
		return rc, fmt.Errorf("field %s: %w", field(orFieldRetentionInterval), err)
	}
	if rc.Interval <= 0 {
		return rc, fmt.Errorf("field %s: %q must be positive", field(orFieldRetentionInterval), interval)
	}
	return rc, nil
}

// lintRetention checks the retention block (defaults filled in) as
// parseRetention does. An empty interval is an unset variable.
func lintRetention(v any) []string {
	m, _ := v.(map[string]any)
	olderThan, _ := m[orFieldRetentionOlderThan].(string)
	force, _ := m[orFieldRetentionForce].(bool)
	interval, _ := m[orFieldRetentionInterval].(string)
	if olderThan == "" || interval == "" {
		return nil
	}
	if _, err := checkRetention(olderThan, force, interval); err != nil {
		return []string{err.Error()}
	}
	return nil
}

// lintRequeue checks the failed_requeue block (defaults filled in) as the
// constructor does.
func lintRequeue(v any) []string {
	m, _ := v.(map[string]any)
	after, okAfter, err := fieldlint.ParseDuration(orFieldRequeue+"."+orFieldRequeueAfter, m[orFieldRequeueAfter])
	rounds, okRounds := fieldlint.ToInt(m[orFieldRequeueRounds])
	switch {
	case err != nil || !okAfter || !okRounds:
		return nil // the after field's own rule reports a bad duration
	}
	if err := checkRequeue(after, rounds); err != nil {
		return []string{err.Error()}
	}
	return nil
}

// The checks of single fields, which start-up runs on the parsed values and
// lint (fieldlint) on the values written, with the same words.
var (
	checkBatchSize        = fieldlint.Range(1, math.MaxInt, "field "+orFieldBatchSize+": %d must be at least 1")
	checkLease            = fieldlint.Range(time.Second, fieldlint.MaxDuration, "field "+orFieldLease+": %v must be at least 1s (CLAIM_LEASE)")
	checkPollInterval     = fieldlint.Range(1, fieldlint.MaxDuration, "field "+orFieldPollInterval+": %v must be positive")
	checkMaxUnacked       = fieldlint.Range(1, math.MaxInt, "field "+orFieldMaxUnacked+": %d must be at least 1")
	checkMaxUnackedDirect = fieldlint.Range(0, math.MaxInt, "field "+orFieldMaxUnackedDirect+": %d must not be negative")
	checkNackDelay        = fieldlint.Range(0, fieldlint.MaxDuration, "field "+orFieldNackDelay+": %v must not be negative")
	checkMaxAttempts      = fieldlint.Range(1, outboxdb.MaxAttemptsLimit,
		"field "+orFieldMaxAttempts+": %d must be from 1 to "+strconv.Itoa(outboxdb.MaxAttemptsLimit)+" (a row counts its attempts in an integer column)")
)

// checkRequeue checks the failed_requeue block.
func checkRequeue(after time.Duration, rounds int) error {
	switch {
	case after < 0 || rounds < 0:
		return fmt.Errorf("field %s: after (%v) and rounds (%d) must not be negative (FAILED_REQUEUE_AFTER, FAILED_REQUEUE_ROUNDS)",
			orFieldRequeue, after, rounds)
	case rounds > outboxdb.MaxRequeueRounds:
		return fmt.Errorf("field %s.%s: %d is more than %d, the most a row's count of rounds holds (FAILED_REQUEUE_ROUNDS)",
			orFieldRequeue, orFieldRequeueRounds, rounds, outboxdb.MaxRequeueRounds)
	}
	return nil
}

func parseMaxUnackedBytes(s string) (int64, error) {
	n, err := parseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("field %s: %w", orFieldMaxUnackedBytes, err)
	}
	return n, nil
}

func parseOrderOnFailed(s string) (outboxdb.OrderOnFailed, error) {
	v, err := outboxdb.ParseOrderOnFailed(s)
	if err != nil {
		return v, fmt.Errorf("field %s (ORDER_ON_FAILED in the shipped pipeline): %w", orFieldOrderOnFailed, err)
	}
	return v, nil
}

func parsePartitionWidth(s string) (time.Duration, error) {
	w, err := outboxdb.ParsePartitionWidth(s)
	if err != nil {
		return w, fmt.Errorf("field %s (OUTBOX_PARTITION in the shipped pipeline): %w", orFieldPartitionWidth, err)
	}
	return w, nil
}
