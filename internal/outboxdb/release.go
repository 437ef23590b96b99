package outboxdb

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// maxReasonBytes caps the reason stored in last_error and the attempt log.
const maxReasonBytes = 1000

// Release gives claims back before their lease runs out, in one statement:
// each row still IN_PROGRESS under its claim token goes back to PENDING, due
// after delay (0: at once), with the claim cleared; rows whose claim has moved
// on (lease expired and claimed again, or result already written) are left
// alone. The attempt stands: it may have reached the platform, so it keeps
// counting toward the maximum, reason becomes last_error and an attempt log
// row records it. Idle dispatchers are notified. It returns how many rows were
// released.
func Release(ctx context.Context, q Querier, refs []ClaimRef, delay time.Duration, reason string) (int64, error) {
	return release(ctx, q, refs, delay, false, reason)
}

// ReleaseUnsent undoes claims whose rows were never handed out (the claim
// raced a shutdown): fenced like Release, but attempt_count goes back down and
// no attempt is logged, as if the claim had not happened. The rows are due at
// once.
func ReleaseUnsent(ctx context.Context, q Querier, refs []ClaimRef) (int64, error) {
	return release(ctx, q, refs, 0, true, "")
}

func release(ctx context.Context, q Querier, refs []ClaimRef, delay time.Duration, undo bool, reason string) (int64, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	ids, tokens := claimArrays(refs)
	var released, notified int64
	err := q.QueryRow(ctx, releaseSQL, ids, tokens, max(delay, 0).Milliseconds(), undo, cleanReason(reason), NotifyChannel).
		Scan(&released, &notified)
	if err != nil {
		return 0, fmt.Errorf("releasing %d claimed rows: %w", len(refs), err)
	}
	return released, nil
}

// cleanReason makes s storable as text (valid UTF-8, no NUL) and cuts it to
// at most maxReasonBytes without splitting a character.
func cleanReason(s string) string {
	n := maxReasonBytes
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ReleaseSQL is the release statement, exported for plan tests.
func ReleaseSQL() string { return releaseSQL }
