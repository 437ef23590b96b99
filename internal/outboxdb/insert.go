package outboxdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// InsertSQL is the batch insert statement (also the insert of direct
// dispatch), exported for plan tests and benchmarks.
func InsertSQL() string { return insertSQL }

// NewRecord is one message to persist with InsertBatchCount or InsertBatchClaim.
type NewRecord struct {
	// MessageKey is the idempotency key (message_key): a second record with
	// the same key, in the same batch or any later one, is not inserted.
	MessageKey string
	// APIType is VEHICLE_EVENT or HEARTBEAT; a FAILED row whose type could not
	// be resolved carries a placeholder such as UNKNOWN.
	APIType string
	// KafkaTopic, KafkaPartition and KafkaOffset say where the message was read.
	KafkaTopic     string
	KafkaPartition int32
	KafkaOffset    int64
	// KafkaKey is the record's key, byte for byte; nil stores NULL (no key).
	KafkaKey []byte
	// Payload is the message as received, stored byte for byte in a bytea
	// column; nil is stored as an empty payload.
	Payload []byte
	// Status is StatusPending (due at once) or StatusFailed (kept for
	// inspection, never sent).
	Status Status
	// LastError says why a FAILED row failed; empty for a PENDING row.
	LastError string
	// PlateNo, ParkCode, BerthCode and DeviceID are copied from the payload
	// for lookups (outbox find, the console); empty when absent.
	PlateNo, ParkCode, BerthCode, DeviceID string
	// OrderingKey, when set on a PENDING record, orders the row after every
	// earlier row with the same key (docs/architecture.md, "Ordering"): it
	// is inserted held while one of them is unfinished or blocks the key.
	// Records of one batch with the same key are ordered as in the batch.
	// Ignored for FAILED records.
	OrderingKey string
	// TraceParent is the W3C traceparent of the span that inserts the
	// message (docs/operations.md, "Tracing"), returned by every claim of
	// the row so that its requests join the message's trace; "" stores
	// NULL (tracing off).
	TraceParent string
}

// MaxKeyBytes is the longest message_key the inserts accept. The unique
// btree index on message_key cannot hold entries much over 2.7 kB; a key that
// long is a broken producer, not an identity.
const MaxKeyBytes = 1024

// CheckKey says why key cannot be stored as a message_key, or returns nil.
// A text column holds neither NUL characters nor invalid UTF-8, and the index
// limits the length; a key breaking these would fail its whole batch forever.
func CheckKey(key string) error {
	switch {
	case key == "":
		return errors.New("key is empty")
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("key is %d bytes, longer than the %d-byte limit", len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return errors.New("key is not valid UTF-8")
	case strings.IndexByte(key, 0) >= 0:
		return errors.New("key contains a NUL character")
	}
	return nil
}

// InsertCounts says how many rows InsertBatchCount created, by status.
type InsertCounts struct {
	Pending, Failed int
	// Existing is how many records created no row: their key was stored
	// already (Kafka redelivered them, or a producer reused the key; see
	// KeyConflicts), or an earlier record of the batch had it.
	Existing int
}

// InsertBatchCount persists recs idempotently and returns how many rows it
// created, by status.
//
// Records are deduplicated by key first (the first one wins) and inserted in
// one statement (insert.sql) that also notifies NotifyChannel, in the same
// transaction, when a PENDING row was inserted. Records whose key already
// had a row change nothing and are not counted. q may be a pool, a
// connection or a transaction; outside a transaction the insert and its
// notification commit on their own, before InsertBatchCount returns.
func InsertBatchCount(ctx context.Context, q Querier, recs []NewRecord) (InsertCounts, error) {
	c, _, err := InsertBatchClaim(ctx, q, recs, DirectClaim{})
	return c, err
}

// DirectClaim says which new rows InsertBatchClaim inserts already claimed,
// and for whom.
type DirectClaim struct {
	// Limit caps the rows inserted claimed: the first Limit PENDING records
	// of the batch, in batch order, duplicates left out. The rest are
	// inserted PENDING, as by InsertBatchCount. A record whose key already
	// has a row takes its slot without being inserted: which keys exist is
	// known only once the statement ran.
	Limit int
	// Lease and Claimer as in ClaimParams.
	Lease   time.Duration
	Claimer string
	// Tokens are claim tokens (NewClaimTokens) for the records that may be
	// claimed, in claim order: the first Limit are claimed now, so there
	// must be at least Limit of them; nil draws fresh ones.
	Tokens []string
	// Retry marks a repeat of a call whose outcome is unknown (its reply was
	// lost; it may have committed) with the same records: given the Tokens
	// of that call (extended if need be), the rows it claimed come back
	// claimed too, as if its reply had arrived, instead of waiting out their
	// lease. They may be more than Limit.
	Retry bool
}

// NewClaimTokens returns n fresh claim tokens (random UUIDs) for
// DirectClaim.Tokens.
func NewClaimTokens(n int) []string {
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = uuid.NewString()
	}
	return tokens
}

// InsertBatchClaim is InsertBatchCount for a processor whose process runs a
// dispatcher with room for c.Limit more rows: up to c.Limit of the new
// PENDING rows are inserted IN_PROGRESS, claimed for c.Claimer with
// attempt_count 1, as ClaimDue would have left them, and come back as
// Records (sorted by id) for that dispatcher to send. Claimed rows are
// not counted in the returned InsertCounts.Pending; records whose key
// already had a row are neither counted nor returned, except, with c.Retry,
// a row still IN_PROGRESS under the claim token c.Tokens gives its record,
// which comes back claimed.
func InsertBatchClaim(ctx context.Context, q Querier, recs []NewRecord, c DirectClaim) (InsertCounts, []Record, error) {
	if len(recs) == 0 {
		return InsertCounts{}, nil, nil
	}
	first, unique, err := dedupe(recs)
	if err != nil {
		return InsertCounts{}, nil, err
	}
	args := insertArgs(recs, unique)
	if c.Limit > 0 || c.Retry {
		if c.Tokens == nil {
			c.Tokens = NewClaimTokens(c.Limit)
		}
		if len(c.Tokens) < c.Limit {
			return InsertCounts{}, nil, fmt.Errorf("inserting outbox rows: %d claim tokens for a limit of %d", len(c.Tokens), c.Limit)
		}
		// unique is in key order (the lock order); claim in batch order.
		pos := make(map[int]int, len(unique))
		for j, i := range unique {
			pos[i] = j
		}
		statuses, tokens, n := args[argStatus].([]string), args[argToken].([]string), 0
		// A record whose ordering key an earlier record of the batch has will
		// be held behind it: it takes no claim, which goes to the next head.
		seenKeys := map[string]bool{}
		for i := range recs {
			j, ok := pos[i]
			if !ok || n == len(c.Tokens) || statuses[j] != string(StatusPending) {
				continue
			}
			if k := recs[i].OrderingKey; k != "" {
				if seenKeys[k] {
					continue
				}
				seenKeys[k] = true
			}
			if n < c.Limit {
				statuses[j] = string(StatusInProgress)
			}
			tokens[j] = c.Tokens[n]
			n++
		}
	}
	var (
		counts  InsertCounts
		claimed []Record
	)
	err = runInsert(ctx, q, args, orderLockKeys(recs, unique), c, func(r insertedRow) error {
		i, ok := first[r.Key]
		if !ok || r.Token == nil || r.Due == nil {
			return fmt.Errorf("insert returned an unknown or unclaimed key %q", r.Key)
		}
		rec := &recs[i]
		claimed = append(claimed, Record{
			ID: r.ID, MessageKey: r.Key, APIType: rec.APIType, KafkaTopic: rec.KafkaTopic,
			KafkaPartition: rec.KafkaPartition, KafkaOffset: rec.KafkaOffset, KafkaKey: rec.KafkaKey,
			Payload: rec.Payload, Status: StatusInProgress, AttemptCount: 1, ClaimToken: *r.Token,
			CreatedAt: r.Created, NextRetryAt: r.Due, TraceParent: nullable(rec.TraceParent),
		})
		return nil
	}, &counts)
	if err != nil {
		return InsertCounts{}, nil, err
	}
	slices.SortFunc(claimed, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	counts.Existing = max(len(recs)-counts.Pending-counts.Failed-len(claimed), 0)
	return counts, claimed, nil
}

// ReusedCoordinates returns the indexes in recs, records about to be
// inserted each keyed by its Kafka coordinates, of those to be stored under
// reusedKeys[i] instead (insert_reused_coordinates.sql): their coordinates
// key a row with another payload, an earlier message's at the same
// coordinates, or a row is stored under reusedKeys[i] already.
func ReusedCoordinates(ctx context.Context, q Querier, recs []NewRecord, reusedKeys []string) ([]int, error) {
	keys, payloads := keysAndPayloads(recs)
	idx, err := positions(q.Query(ctx, reusedCoordsSQL, keys, payloads, reusedKeys))
	if err != nil {
		return nil, fmt.Errorf("looking for rows at the same Kafka coordinates: %w", err)
	}
	return idx, nil
}

// KeyConflicts returns the indexes in recs, a batch inserted already, of the
// records whose key is stored with a different payload (keyConflictsSQL):
// messages that reused another's key and were not stored, where a
// redelivery of the stored message would be byte for byte the same.
func KeyConflicts(ctx context.Context, q Querier, recs []NewRecord) ([]int, error) {
	keys, payloads := keysAndPayloads(recs)
	idx, err := positions(q.Query(ctx, keyConflictsSQL, keys, payloads))
	if err != nil {
		return nil, fmt.Errorf("comparing the payloads of duplicate keys: %w", err)
	}
	return idx, nil
}

// keysAndPayloads are recs' keys and payloads, as the statements that
// compare them take them.
func keysAndPayloads(recs []NewRecord) ([]string, [][]byte) {
	keys := make([]string, len(recs))
	payloads := make([][]byte, len(recs))
	for i := range recs {
		keys[i], payloads[i] = recs[i].MessageKey, recs[i].Payload
	}
	return keys, payloads
}

// positions turns the 1-based positions a statement returns into indexes.
func positions(rows pgx.Rows, err error) ([]int, error) {
	if err != nil {
		return nil, err
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	idx := make([]int, len(ns))
	for i, n := range ns {
		idx[i] = int(n) - 1
	}
	return idx, nil
}

// maxOrderConflictTries bounds the attempts of one insert that keeps
// meeting keys gaining active rows under it (see insert.sql).
const maxOrderConflictTries = 5

// insertedRow is one row insert.sql sent back.
type insertedRow struct {
	ID      int64
	Key     string
	Status  Status
	Token   *string
	Created time.Time
	Due     *time.Time
}

// runInsert runs insert.sql with args (insertArgs) and the claim c, after
// locking the ordering keys keys (see queryLocked), calls each for every row
// it claimed (inserted or recovered) and adds the inserted PENDING and FAILED rows to counts.
func runInsert(ctx context.Context, q Querier, args []any, keys []string, c DirectClaim, each func(insertedRow) error, counts *InsertCounts) error {
	// The trace contexts come last ($20): they were added to the statement
	// after its other parameters.
	traces := args[argTrace]
	args = append(args[:argTrace:argTrace], NotifyChannel, c.Lease.Milliseconds(), c.Claimer, c.Retry, traces)
	var (
		id             *int64
		key            *string
		status         string
		r              insertedRow
		created        *time.Time
		pending, faild *int64
		// One attempt's rows, kept until it succeeds: an attempt that fails
		// may have sent some back before the error.
		got   []insertedRow
		total InsertCounts
	)
	read := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&id, &key, &status, &r.Token, &created, &r.Due, &pending, &faild}, func() error {
			if status == "" { // the summary
				total.Pending += int(*pending)
				total.Failed += int(*faild)
				return nil
			}
			if id == nil || key == nil || created == nil {
				return errors.New("insert returned a row without id, key or creation time")
			}
			r.ID, r.Key, r.Status, r.Created = *id, *key, Status(status), *created
			got = append(got, r)
			return nil
		})
		return err
	}
	// A key that gained an active row between the lock statement and the
	// insert fails the insert, which then committed nothing: run it again
	// (it then locks the key). So does a time no partition covers yet (the
	// dispatchers keep partitions ahead, but none may be running): create
	// it and run the insert again, once.
	var (
		err     error
		ensured bool
	)
	for try := 1; ; try++ {
		got, total = got[:0], InsertCounts{}
		err = queryInsertLocked(ctx, q, keys, insertSQL, args, args[0].([]string), read)
		if err != nil && !ensured && isMissingPartition(err) {
			ensured = true
			if eerr := ensureCurrentPartition(ctx, q); eerr != nil {
				err = fmt.Errorf("%w (%w)", err, eerr)
				break
			}
			continue
		}
		if err == nil || !isOrderConflict(err) || try >= maxOrderConflictTries {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("inserting outbox rows: %w", err)
	}
	counts.Pending += total.Pending
	counts.Failed += total.Failed
	for _, r := range got {
		if err := each(r); err != nil {
			return fmt.Errorf("inserting outbox rows: %w", err)
		}
	}
	return nil
}

// dedupe checks recs and returns the index of each key's first record and
// those indexes ordered by key: one lock order for every inserter (see
// insert.sql).
func dedupe(recs []NewRecord) (first map[string]int, unique []int, err error) {
	first = make(map[string]int, len(recs))
	unique = make([]int, 0, len(recs))
	for i := range recs {
		if s := recs[i].Status; s != StatusPending && s != StatusFailed {
			return nil, nil, fmt.Errorf("inserting outbox rows: record %q has status %q, want PENDING or FAILED", recs[i].MessageKey, s)
		}
		if err := CheckKey(recs[i].MessageKey); err != nil {
			return nil, nil, fmt.Errorf("inserting outbox rows: record %d: %w", i, err)
		}
		if _, dup := first[recs[i].MessageKey]; !dup {
			first[recs[i].MessageKey] = i
			unique = append(unique, i)
		}
	}
	slices.SortFunc(unique, func(a, b int) int { return strings.Compare(recs[a].MessageKey, recs[b].MessageKey) })
	keepBatchOrderPerOrderingKey(recs, unique)
	return first, unique, nil
}

// keepBatchOrderPerOrderingKey reorders, in place, the records of unique
// that share an ordering key so that they follow batch order, each key's
// records taking the slots its records had: rows are inserted, and get
// their ids, in the order of unique, and a key's rows are delivered in id
// order. The other records keep their key order, which is what keeps
// concurrent inserters of the same messages from deadlocking; two inserters
// of one ordered message cannot meet, since both lock its ordering key
// first (order_lock.sql).
func keepBatchOrderPerOrderingKey(recs []NewRecord, unique []int) {
	slots := map[string][]int{}
	for pos, i := range unique {
		if k := orderingKeyOf(&recs[i]); k != "" {
			slots[k] = append(slots[k], pos)
		}
	}
	for _, ps := range slots {
		if len(ps) < 2 {
			continue
		}
		idx := make([]int, len(ps))
		for j, pos := range ps {
			idx[j] = unique[pos]
		}
		slices.Sort(idx) // batch order
		for j, pos := range ps {
			unique[pos] = idx[j]
		}
	}
}

// Positions of insertArgs's arrays in insert.sql's parameters.
const (
	argStatus = 7
	argToken  = 9
	argTrace  = 15
)

// insertArgs lays recs[idx...] out as the parallel arrays of insert.sql,
// $1-$15 then the one runInsert passes as $20; no row is claimed yet (no
// tokens).
func insertArgs(recs []NewRecord, idx []int) []any {
	n := len(idx)
	var (
		keys       = make([]string, n)
		apiTypes   = make([]string, n)
		topics     = make([]string, n)
		partitions = make([]int32, n)
		offsets    = make([]int64, n)
		kafkaKeys  = make([][]byte, n)
		payloads   = make([][]byte, n)
		statuses   = make([]string, n)
		lastErrors = make([]string, n)
		tokens     = make([]string, n)
		plates     = make([]string, n)
		parks      = make([]string, n)
		berths     = make([]string, n)
		devices    = make([]string, n)
		orderKeys  = make([]string, n)
		traces     = make([]string, n)
	)
	for j, i := range idx {
		r := &recs[i]
		keys[j] = r.MessageKey
		apiTypes[j] = r.APIType
		topics[j] = r.KafkaTopic
		partitions[j] = r.KafkaPartition
		offsets[j] = r.KafkaOffset
		kafkaKeys[j] = r.KafkaKey
		payloads[j] = r.Payload
		if payloads[j] == nil {
			payloads[j] = []byte{} // a nil element would be NULL; payload is NOT NULL
		}
		statuses[j] = string(r.Status)
		lastErrors[j] = r.LastError
		plates[j], parks[j], berths[j], devices[j] = r.PlateNo, r.ParkCode, r.BerthCode, r.DeviceID
		orderKeys[j] = orderingKeyOf(r)
		traces[j] = r.TraceParent
	}
	return []any{keys, apiTypes, topics, partitions, offsets, kafkaKeys, payloads, statuses, lastErrors,
		tokens, plates, parks, berths, devices, orderKeys, traces}
}

// nullable is s, nil when empty.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
