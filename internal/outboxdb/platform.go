package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	platformReadSQL  = mustSQL("platform_read.sql")
	platformSetSQL   = mustSQL("platform_set.sql")
	platformProbeSQL = mustSQL("platform_probe.sql")
	platformPauseSQL = mustSQL("platform_pause.sql")
	platformRateSQL  = mustSQL("platform_rate.sql")
)

// PlatformState is what every instance sharing the database knows about
// the platform (table forward_platform_state).
type PlatformState struct {
	// Breaker is CLOSED, HALF_OPEN or OPEN.
	Breaker   string
	ChangedAt time.Time
	Reason    string
	// NextProbeAt is when an open breaker's next probe may go.
	NextProbeAt time.Time
	// PausedUntil: no request before this time.
	PausedUntil time.Time
	// Now is the database clock when the state was read.
	Now time.Time
	// PausedFor and ProbeIn are what was left, when the row was read, of
	// the pause and until the next probe (0 when past): add them to the
	// local clock when the reply arrives.
	PausedFor, ProbeIn time.Duration
}

// ReadPlatformState reads the shared state.
func ReadPlatformState(ctx context.Context, q Querier) (PlatformState, error) {
	var (
		s              PlatformState
		pausedMs, inMs int64
	)
	if err := q.QueryRow(ctx, platformReadSQL).Scan(&s.Breaker, &s.ChangedAt, &s.Reason, &s.NextProbeAt, &s.PausedUntil, &s.Now, &pausedMs, &inMs); err != nil {
		return s, fmt.Errorf("reading the platform state: %w", err)
	}
	s.PausedFor, s.ProbeIn = time.Duration(pausedMs)*time.Millisecond, time.Duration(inMs)*time.Millisecond
	return s, nil
}

// SetBreaker moves the shared breaker from one of the states from to state
// to, and says whether this call changed it. Opening schedules the first
// probe probeInterval from now.
func SetBreaker(ctx context.Context, q Querier, from []string, to, instance, reason string, probeInterval time.Duration) (bool, error) {
	var changed bool
	err := q.QueryRow(ctx, platformSetSQL, from, to, instance, CleanText(reason, MaxErrorLen), probeInterval.Milliseconds()).Scan(&changed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("setting the breaker %s: %w", to, err)
	}
	return changed, nil
}

// TryProbe takes the next probe of an open breaker for the caller, if its
// time has come and no other instance took it; the next one is then due
// interval later.
func TryProbe(ctx context.Context, q Querier, interval time.Duration) (bool, error) {
	var won bool
	err := q.QueryRow(ctx, platformProbeSQL, interval.Milliseconds()).Scan(&won)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("taking a probe: %w", err)
	}
	return won, nil
}

// PausePlatform stops every instance sending for d (or keeps a longer pause)
// and returns until when sending is paused.
func PausePlatform(ctx context.Context, q Querier, d time.Duration) (time.Time, error) {
	var until time.Time
	if err := q.QueryRow(ctx, platformPauseSQL, d.Milliseconds()).Scan(&until); err != nil {
		return until, fmt.Errorf("pausing the platform: %w", err)
	}
	return until, nil
}

// TakeRateTokens takes n tokens of the global rate limit (rate per second,
// bucket of burst tokens). When it cannot, it returns how long until n
// tokens will be there.
func TakeRateTokens(ctx context.Context, q Querier, n int, rate, burst float64) (granted bool, wait time.Duration, err error) {
	var tokens float64
	if err := q.QueryRow(ctx, platformRateSQL, float64(n), rate, burst).Scan(&granted, &tokens); err != nil {
		return false, 0, fmt.Errorf("taking rate tokens: %w", err)
	}
	if granted {
		return true, 0, nil
	}
	return false, time.Duration((float64(n) - tokens) / rate * float64(time.Second)), nil
}
