package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RenewSQL is the lease renewal, exported for plan tests.
func RenewSQL() string { return renewSQL }

// RenewLeases extends the leases of refs to lease from now, in one statement,
// and returns the new deadline of each claim still held; the refs missing
// from the result were lost (see renew.sql).
func RenewLeases(ctx context.Context, q Querier, refs []ClaimRef, lease time.Duration) (map[int64]time.Time, error) {
	if len(refs) == 0 {
		return map[int64]time.Time{}, nil
	}
	ids, tokens := claimArrays(refs)
	rows, err := q.Query(ctx, renewSQL, ids, tokens, lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("renewing %d leases: %w", len(refs), err)
	}
	renewed := make(map[int64]time.Time, len(refs))
	var (
		id       int64
		deadline time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &deadline}, func() error {
		renewed[id] = deadline
		return nil
	}); err != nil {
		return nil, fmt.Errorf("renewing %d leases: %w", len(refs), err)
	}
	return renewed, nil
}

// RenewSettledSQL is the check of unrenewed claims, exported for plan tests.
func RenewSettledSQL() string { return renewSettledSQL }

// SettledClaims returns which of refs, claims a renewal did not renew, are
// not lost: finished by a result written under that same claim (by the
// holder's own output, before its dispatcher heard of it), or still held
// but skipped because another transaction had the row locked (see
// renew_settled.sql). The others were lost to another dispatcher, a
// requeue or a release. A delivered row is settled when claimer delivered
// it.
func SettledClaims(ctx context.Context, q Querier, refs []ClaimRef, claimer string) (map[int64]bool, error) {
	settled := make(map[int64]bool, len(refs))
	if len(refs) == 0 {
		return settled, nil
	}
	ids, tokens := claimArrays(refs)
	rows, err := q.Query(ctx, renewSettledSQL, ids, tokens, claimer)
	if err != nil {
		return nil, fmt.Errorf("checking %d unrenewed claims: %w", len(refs), err)
	}
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		settled[id] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("checking %d unrenewed claims: %w", len(refs), err)
	}
	return settled, nil
}
