package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var renewSQL = mustSQL("renew.sql")

// RenewSQL is the lease renewal, exported for plan tests.
func RenewSQL() string { return renewSQL }

// RenewLeases extends the leases of refs to lease from now, in one statement,
// and returns the new deadline of each claim still held; the refs missing
// from the result were lost (see renew.sql).
func RenewLeases(ctx context.Context, q Querier, refs []ClaimRef, lease time.Duration) (map[int64]time.Time, error) {
	if len(refs) == 0 {
		return map[int64]time.Time{}, nil
	}
	ids := make([]int64, len(refs))
	tokens := make([]string, len(refs))
	for i, r := range refs {
		ids[i], tokens[i] = r.ID, r.ClaimToken
	}
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
