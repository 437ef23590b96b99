package outboxdb

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetterRef names one dead-letter claim of one row.
type DeadLetterRef struct {
	ID    int64
	Token string
}

// ClaimDeadLetters takes up to limit FAILED rows not yet published to the
// dead-letter topic, oldest id first, in one statement, leasing them for
// lease: a row neither marked nor released by then may be claimed again.
// With several publishers claiming at once no row is taken twice (FOR UPDATE
// SKIP LOCKED). The rows come back sorted by id.
func ClaimDeadLetters(ctx context.Context, q Querier, limit int, lease time.Duration) ([]Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	out, err := queryAll(ctx, q, "claiming failed rows to dead-letter", deadLetterClaimSQL, pgx.RowToStructByNameLax[Record], limit, lease.Milliseconds())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// MarkDeadLettered records that the rows were published, so they are not
// published again, in one statement. It is fenced by the claims: a row
// requeued since (its claim cleared) or claimed by another publisher after
// the lease ran out is left alone. It returns how many rows it marked.
func MarkDeadLettered(ctx context.Context, q Querier, refs []DeadLetterRef) (int64, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	ids, tokens := deadLetterArgs(refs)
	tag, err := q.Exec(ctx, deadLetterMarkSQL, ids, tokens)
	if err != nil {
		return 0, fmt.Errorf("marking %d rows dead-lettered: %w", len(refs), err)
	}
	return tag.RowsAffected(), nil
}

// ReleaseDeadLetters gives claims back unpublished, fenced like
// MarkDeadLettered: the rows may be claimed again after delay (0: at once).
// It returns how many rows it released.
func ReleaseDeadLetters(ctx context.Context, q Querier, refs []DeadLetterRef, delay time.Duration) (int64, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	ids, tokens := deadLetterArgs(refs)
	tag, err := q.Exec(ctx, deadLetterReleaseSQL, ids, tokens, max(delay, 0).Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("releasing %d dead-letter claims: %w", len(refs), err)
	}
	return tag.RowsAffected(), nil
}

func deadLetterArgs(refs []DeadLetterRef) ([]int64, []string) {
	ids := make([]int64, len(refs))
	tokens := make([]string, len(refs))
	for i, r := range refs {
		ids[i], tokens[i] = r.ID, r.Token
	}
	return ids, tokens
}
