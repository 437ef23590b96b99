package outboxdb

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxErrorLen caps, in bytes, the error text stored in last_error and in the
// attempt log's error_message. Longer texts are cut on a rune boundary and
// end with "…".
const MaxErrorLen = 1024

// Result is the outcome of one attempt on a claimed row, as written by
// RecordResults.
type Result struct {
	// ID and ClaimToken identify the row and fence the write: they must be
	// the id and claim_token the row was claimed with.
	ID         int64
	ClaimToken string
	// Status is the state the attempt leaves the row in: StatusSuccess,
	// StatusFailed, or StatusPending for a retry.
	Status Status
	// RetryIn delays a PENDING row: next_retry_at = now() + RetryIn on the
	// database clock (0 makes it due at once). Ignored for other statuses,
	// whose next_retry_at becomes NULL.
	RetryIn time.Duration
	// Sent says a request was made; Duration is meaningful only then.
	Sent     bool
	Duration time.Duration
	// HTTPStatus is the response status, 0 when there was no response.
	HTTPStatus int
	// PlatformErrcode is the platform's errcode, "" when none.
	PlatformErrcode string
	// Error explains a non-success, "" when none. It is stored truncated to
	// MaxErrorLen and must not hold secrets.
	Error string
	// Class says why a FAILED row failed (ClassTransient when empty).
	Class FailureClass
	// Undo marks a claim that was never sent (a lease too short for a
	// request, the platform known to be down, an output stopping): the row
	// goes back to PENDING with attempt_count back down, last_error and
	// last_http_status kept, and no attempt logged. Status must be
	// StatusPending.
	Undo bool
	// ForLease marks an Undo for lack of lease: bounded, after
	// MaxLeaseReturns of them in a row the attempt counts (see record.sql).
	ForLease bool
	// Logged marks an Undo of an attempt that was made but says nothing
	// about the row (a failed probe, an unavailable reply while the platform
	// is known to be down): it is logged, with its error and HTTP status,
	// and does not count.
	Logged bool
}

// FailureClass says why a row is FAILED, which decides whether it may be
// sent again without an operator.
type FailureClass string

const (
	// ClassTransient: out of attempts on retryable or unavailable replies,
	// or lost claims. Automatic compensation may requeue it.
	ClassTransient FailureClass = "TRANSIENT"
	// ClassRejected: the platform refused it for good (errcode 998, a
	// no_retry rule). Never requeued automatically.
	ClassRejected FailureClass = "REJECTED"
	// ClassInvalid: bad input or a mapping error; it cannot be sent as is.
	ClassInvalid FailureClass = "INVALID"
)

// MaxLeaseReturns is how many times in a row a claim may be given back
// unsent for lack of lease before the next give-back counts as an attempt.
const MaxLeaseReturns = 3

// RecordSQL is the result statement, exported for plan tests.
func RecordSQL() string { return recordSQL }

// RecordOptions tunes RecordResults.
type RecordOptions struct {
	// OnFailed is what a row with an ordering key that ends FAILED does to
	// the rows held behind it (OrderSkip when empty).
	OnFailed OrderOnFailed
	// Chain, when its Limit is positive, claims up to Limit of the rows the
	// write releases (the next rows of the keys it finishes) for
	// Chain.Claimer with Chain.Lease, as ClaimDue would: they come back in
	// RecordOutcome.Claimed for the caller's dispatcher to hand over in
	// memory (chained dispatch). The others are due at once, for any
	// dispatcher. Tokens and Retry are not used.
	Chain DirectClaim
}

// RecordOutcome is what RecordResultsChained did.
type RecordOutcome struct {
	// Recorded are the ids whose result was written.
	Recorded []int64
	// Claimed are released rows claimed for RecordOptions.Chain, by id.
	Claimed []Record
}

// RecordResults writes a batch of attempt results in one statement: every row
// whose claim the caller still holds (same claim_token, still IN_PROGRESS)
// takes its new status, next_retry_at, last_http_status, last_error and, for
// SUCCESS, succeeded_at, and gains one forward_retry_logs row (attempt_number
// = the row's attempt_count); an undone claim (Result.Undo) only goes back to
// PENDING. Rows whose claim was lost are left untouched.
//
// A row with an ordering key that ends SUCCESS, or FAILED with
// opts.OnFailed skip, releases the next row held behind it; with block a
// FAILED one keeps holding its key (see record.sql). The ordering keys of
// the rows it finishes are locked first, in the same round trip.
//
// It returns the ids that were written. Calling it again with the same
// results records nothing more, so a caller may retry after an error. The
// write commits without waiting for the WAL flush (see record.sql): inside a
// transaction, that transaction does too.
func RecordResults(ctx context.Context, q Querier, results []Result, opts RecordOptions) ([]int64, error) {
	out, err := RecordResultsChained(ctx, q, results, opts)
	return out.Recorded, err
}

// RecordResultsChained is RecordResults that also returns the released rows
// it claimed for opts.Chain. Should it fail after committing (a lost
// reply), those rows stay claimed until their lease runs out.
func RecordResultsChained(ctx context.Context, q Querier, results []Result, opts RecordOptions) (RecordOutcome, error) {
	onFailed, err := ParseOrderOnFailed(string(opts.OnFailed))
	if err != nil {
		return RecordOutcome{}, fmt.Errorf("recording results: on_failed: %w", err)
	}
	if len(results) == 0 {
		return RecordOutcome{}, nil
	}
	n := len(results)
	var (
		ids        = make([]int64, n)
		tokens     = make([]string, n)
		statuses   = make([]string, n)
		retryIn    = make([]*int64, n)
		httpStatus = make([]*int32, n)
		errs       = make([]*string, n)
		errcodes   = make([]*string, n)
		durations  = make([]*int32, n)
		undo       = make([]bool, n)
		classes    = make([]*string, n)
		forLease   = make([]bool, n)
		logged     = make([]bool, n)
		seen       = make(map[int64]struct{}, n)
		// finishing rows may release or block their ordering keys.
		finishing []int64
	)
	for i, r := range results {
		if _, dup := seen[r.ID]; dup {
			return RecordOutcome{}, fmt.Errorf("recording results: row %d appears twice in one batch", r.ID)
		}
		seen[r.ID] = struct{}{}
		switch r.Status {
		case StatusSuccess, StatusFailed:
			finishing = append(finishing, r.ID)
		case StatusPending:
			ms := max(r.RetryIn.Milliseconds(), 0)
			retryIn[i] = &ms
		default:
			return RecordOutcome{}, fmt.Errorf("recording results: row %d: status %q is not SUCCESS, FAILED or PENDING", r.ID, r.Status)
		}
		if r.Undo && r.Status != StatusPending {
			return RecordOutcome{}, fmt.Errorf("recording results: row %d: an undone claim must go back to PENDING, not %s", r.ID, r.Status)
		}
		undo[i], forLease[i], logged[i] = r.Undo, r.Undo && r.ForLease, r.Undo && r.Logged
		if r.Status == StatusFailed {
			c := string(cmp.Or(r.Class, ClassTransient))
			classes[i] = &c
		}
		ids[i] = r.ID
		tokens[i] = r.ClaimToken
		statuses[i] = string(r.Status)
		if r.HTTPStatus != 0 {
			s := int32(r.HTTPStatus)
			httpStatus[i] = &s
		}
		if r.Error != "" {
			e := CleanText(r.Error, MaxErrorLen)
			errs[i] = &e
		}
		if r.PlatformErrcode != "" {
			e := CleanText(r.PlatformErrcode, 64)
			errcodes[i] = &e
		}
		if r.Sent {
			d := int32(min(r.Duration.Milliseconds(), int64(1<<31-1)))
			durations[i] = &d
		}
	}
	chain := opts.Chain
	if chain.Limit <= 0 {
		chain = DirectClaim{}
	}
	args := []any{ids, tokens, statuses, retryIn, httpStatus, errs, errcodes, durations, undo,
		classes, forLease, MaxLeaseReturns, logged, string(onFailed), NotifyChannel,
		chain.Claimer, chain.Lease.Milliseconds(), max(chain.Limit, 0)}
	out := RecordOutcome{Recorded: make([]int64, 0, n)}
	err = queryLocked(ctx, q, nil, finishing, recordSQL, args, func(rows pgx.Rows) error {
		// Nearly every row is a recorded id: only its id is read. Building
		// a whole Record for each, by reflection, was an eighth of what a
		// backlog's consumer allocated.
		var (
			idOnly []any
			id     *int64
		)
		for rows.Next() {
			if idOnly == nil { // the columns are known once a row came
				var err error
				if idOnly, id, err = idScanTargets(rows.FieldDescriptions()); err != nil {
					return err
				}
			}
			if string(rows.RawValues()[0]) == "r" {
				if err := rows.Scan(idOnly...); err != nil {
					return err
				}
				out.Recorded = append(out.Recorded, *id)
				continue
			}
			r, err := pgx.RowToStructByNameLax[recordedRow](rows)
			if err != nil {
				return err
			}
			r.Status = StatusInProgress
			if r.Payload == nil {
				r.Payload = []byte{}
			}
			out.Claimed = append(out.Claimed, r.Record)
		}
		return rows.Err()
	})
	if err != nil {
		return RecordOutcome{}, fmt.Errorf("recording results: %w", err)
	}
	slices.SortFunc(out.Claimed, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// idScanTargets are the Scan targets that read record.sql's id column
// alone, into id; its first column must be kind.
func idScanTargets(fields []pgconn.FieldDescription) (targets []any, id *int64, err error) {
	if len(fields) == 0 || fields[0].Name != "kind" {
		return nil, nil, fmt.Errorf("record.sql's first column is not kind")
	}
	id = new(int64)
	targets = make([]any, len(fields))
	for i, f := range fields {
		if f.Name == "id" {
			targets[i] = id
			return targets, id, nil
		}
	}
	return nil, nil, fmt.Errorf("record.sql returns no id column")
}

// recordedRow is a row of record.sql: a recorded id (kind "r") or a row
// claimed for chained dispatch (kind "c").
type recordedRow struct {
	Kind string `db:"kind"`
	Record
}

// CleanText makes s storable in a text column and short: invalid UTF-8 and
// NUL bytes (which PostgreSQL rejects, failing the whole statement) become
// U+FFFD, and a text longer than maxBytes is cut on a rune boundary and ends
// with "…".
func CleanText(s string, maxBytes int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= maxBytes {
		return s
	}
	const ellipsis = "…"
	cut := max(maxBytes-len(ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
