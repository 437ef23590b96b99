package outboxdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// spliceLocked is claim with the rows it locks chosen by locked instead:
// the part of claim.sql between its "locked: begin" and "locked: end" lines.
func spliceLocked(claim, locked string) string {
	const begin, end = "-- locked: begin", "-- locked: end"
	i, j := strings.Index(claim, begin), strings.Index(claim, end)
	if i < 0 || j < i {
		panic("outboxdb: claim.sql lacks its locked: begin/end markers")
	}
	return claim[:i] + locked + "\n    " + claim[j:]
}

// ClaimRef names one claim of one row: writes fenced by it change the row only
// while that claim still holds it.
type ClaimRef struct {
	ID         int64
	ClaimToken string
}

// claimArrays lays refs out as the pairwise id and token arrays the fenced
// statements take ($1, $2).
func claimArrays(refs []ClaimRef) (ids []int64, tokens []string) {
	ids, tokens = make([]int64, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		ids[i], tokens[i] = r.ID, r.ClaimToken
	}
	return ids, tokens
}

// MaxByteBudget is the largest byte budget a dispatcher may be given
// (4 EiB): a budget plus the size of a row held beyond it stays within an
// int64.
const MaxByteBudget = 1 << 62

// MaxAttemptsLimit is the most attempts a row may be given: a row counts
// its attempts in an integer column.
const MaxAttemptsLimit = math.MaxInt32

// ClaimParams says what to claim.
type ClaimParams struct {
	// Limit caps the rows taken by one claim (exhausted ones included).
	Limit int
	// MaxBytes caps the payload bytes of the rows taken, except that the
	// first row is always taken; zero or less: no cap.
	MaxBytes int64
	// Lease is how long the claimed rows stay owned without a result; after it
	// they are due again for any dispatcher.
	Lease time.Duration
	// Claimer identifies the dispatcher in claimed_by and in attempt logs.
	Claimer string
	// MaxAttempts fails, instead of claiming, a due row whose attempt_count has
	// reached it. Zero or less: no limit.
	MaxAttempts int
	// Probe claims the one row a probe of an open breaker carries: of the
	// first due rows, the one whose attempts are least spent, attempted
	// longest ago (claim_probe.sql). Limit is then 1.
	Probe bool
}

// ClaimResult is what one claim statement did.
type ClaimResult struct {
	// Claimed rows are IN_PROGRESS, leased to the claimer, with their
	// message (payload, Kafka origin).
	Claimed []Record
	// Exhausted rows were due but out of attempts: they are claimed, and
	// must be recorded FAILED (FailExhausted); their last_error names why.
	Exhausted []Record
}

// claimedRecord is a row of claim.sql.
type claimedRecord struct {
	Record
	Exhausted bool `db:"exhausted"`
}

// ClaimSQL is the claim statement, exported for plan tests. Its parameters:
// $1 limit, $2 lease in milliseconds, $3 claimer, $4 max attempts (<= 0: no
// limit), $5 byte budget (< 0: none).
func ClaimSQL() string { return claimSQL }

// ClaimDue takes up to p.Limit due rows (new, retries and rows whose lease
// expired), oldest due first, in one statement; they come back sorted by id.
// Claimed rows come back IN_PROGRESS with a fresh claim token and
// attempt_count already counting this attempt; a row whose lease expired
// leaves a LEASE_EXPIRED attempt log. Due rows out of attempts are claimed
// without counting one and reported in Exhausted, for the caller to record
// them FAILED (FailExhausted). With several dispatchers claiming at once no
// row is taken twice (FOR UPDATE SKIP LOCKED). The claim commits without
// waiting for the WAL flush (see claim.sql).
func ClaimDue(ctx context.Context, q Querier, p ClaimParams) (ClaimResult, error) {
	sql := claimSQL
	if p.Probe {
		sql, p.Limit = claimProbeSQL, 1
	}
	if p.Limit <= 0 {
		return ClaimResult{}, nil
	}
	maxBytes := p.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	rows, err := q.Query(ctx, sql, p.Limit, p.Lease.Milliseconds(), p.Claimer, max(p.MaxAttempts, 0), maxBytes)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claiming due rows: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[claimedRecord])
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claiming due rows: %w", err)
	}
	var res ClaimResult
	for _, r := range got {
		if r.Exhausted {
			res.Exhausted = append(res.Exhausted, r.Record)
			continue
		}
		res.Claimed = append(res.Claimed, r.Record)
	}
	// RETURNING has no order; ids give a stable one (roughly arrival order).
	slices.SortFunc(res.Claimed, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	return res, nil
}

// FailExhausted records the exhausted rows of a claim FAILED (class
// TRANSIENT: automatic compensation may requeue them), each with the reason
// the claim gave it, through the result write (which releases or blocks
// their ordering keys as opts say), and returns the ids written.
func FailExhausted(ctx context.Context, q Querier, rows []Record, opts RecordOptions) ([]int64, error) {
	results := make([]Result, len(rows))
	for i, r := range rows {
		results[i] = Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: StatusFailed, Class: ClassTransient, Error: r.LastErrorText()}
	}
	return RecordResults(ctx, q, results, opts)
}

// Claim takes up to limit due rows for claimer, leasing them for lease, with
// no limit on attempts. The rows come back IN_PROGRESS with a fresh claim
// token and attempt_count already counting this attempt. Dispatchers use
// ClaimDue, which also ends rows that ran out of attempts.
func Claim(ctx context.Context, q Querier, limit int, lease time.Duration, claimer string) ([]Record, error) {
	res, err := ClaimDue(ctx, q, ClaimParams{Limit: limit, Lease: lease, Claimer: claimer})
	return res.Claimed, err
}

// NextDue reports how long until the next unfinished row falls due: a PENDING
// row's retry time or an IN_PROGRESS row's lease deadline, as the database's
// clock sees it. The duration is zero or negative when a row is due already
// (typically one another dispatcher holds locked this instant). ok is false
// when no row is unfinished. It reads one entry of the due index.
func NextDue(ctx context.Context, q Querier) (d time.Duration, ok bool, err error) {
	var ms int64
	switch err := q.QueryRow(ctx, nextDueSQL).Scan(&ms); {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("reading next due time: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}

func textOrEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
