package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	// Pause is the operator's pause, the latest one (in force or not).
	Pause DeliveryPause
}

// Stopped says whether requests are held back now: the breaker is open
// (only probes go), a Retry-After pause runs, or an operator's pause is in
// force (nothing goes).
func (p PlatformState) Stopped() bool {
	return p.Breaker == "OPEN" || p.PausedUntil.After(p.Now) || p.Pause.InForce
}

// DeliveryPause is an operator's pause of delivery (`forwarder outbox
// pause`, the console): while it is in force no instance sends a request.
type DeliveryPause struct {
	// Since is when it began; zero when delivery was never paused.
	Since time.Time
	// Until is when it ends by itself; zero: only a resume ends it. A
	// resume sets it to the moment of the resume.
	Until time.Time
	// By and Reason are the operator and what they gave as the reason.
	By, Reason string
	// InForce: the pause holds delivery now (as of the read).
	InForce bool
	// Left is what was left of a pause in force with an end, when the row
	// was read (0: none, or until resumed).
	Left time.Duration
}

// ReadPlatformState reads the shared state.
func ReadPlatformState(ctx context.Context, q Querier) (PlatformState, error) {
	var (
		s              PlatformState
		pausedMs, inMs int64
		since, until   *time.Time
		left           *int64
	)
	if err := q.QueryRow(ctx, platformReadSQL).Scan(&s.Breaker, &s.ChangedAt, &s.Reason, &s.NextProbeAt, &s.PausedUntil, &s.Now, &pausedMs, &inMs,
		&since, &until, &s.Pause.By, &s.Pause.Reason, &s.Pause.InForce, &left); err != nil {
		return s, fmt.Errorf("reading the platform state: %w", err)
	}
	s.PausedFor, s.ProbeIn = time.Duration(pausedMs)*time.Millisecond, time.Duration(inMs)*time.Millisecond
	if since != nil {
		s.Pause.Since = *since
	}
	if until != nil {
		s.Pause.Until = *until
	}
	if left != nil && s.Pause.InForce {
		s.Pause.Left = time.Duration(*left) * time.Millisecond
	}
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
// and returns until when sending is paused. d is counted from the
// statement's start on the server, after the caller measured it, and in
// whole milliseconds rounded up: the pause is never shorter than asked.
func PausePlatform(ctx context.Context, q Querier, d time.Duration) (time.Time, error) {
	var until time.Time
	ms := (max(d, 0) + time.Millisecond - 1) / time.Millisecond
	if err := q.QueryRow(ctx, platformPauseSQL, int64(ms), NotifyChannel).Scan(&until, nil); err != nil {
		return until, fmt.Errorf("pausing the platform: %w", err)
	}
	return until, nil
}

// pauseNotice starts the payload of the notification on NotifyChannel with
// which PausePlatform tells every instance what is left of the pause.
const pauseNotice = "pause "

// PauseNotice reads a notification's payload on NotifyChannel: ok when it
// announces a pause shared by PausePlatform, with what was left of it when
// it was sent (counted from its arrival, the pause lasts as long or a
// little longer, never shorter).
func PauseNotice(payload string) (left time.Duration, ok bool) {
	ms, found := strings.CutPrefix(payload, pauseNotice)
	if !found {
		return 0, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 || n > int64(math.MaxInt64/time.Millisecond) {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// healthyNotice starts the payload of the notification on NotifyChannel with
// which AnnounceHealthy tells the other instances the platform answered.
const healthyNotice = "healthy "

// AnnounceHealthy tells every instance sharing the database that instance
// had a healthy reply from the platform ago (in whole milliseconds, rounded
// down: the reply is never taken as later than it was).
func AnnounceHealthy(ctx context.Context, q Querier, instance string, ago time.Duration) error {
	payload := healthyNotice + strconv.FormatInt(max(ago, 0).Milliseconds(), 10) + " " + instance
	if _, err := q.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, payload); err != nil {
		return fmt.Errorf("announcing a healthy reply: %w", err)
	}
	return nil
}

// HealthyNotice reads a notification's payload on NotifyChannel: ok when it
// is AnnounceHealthy's, with the instance that sent it and how long before
// it was sent the platform answered that instance.
func HealthyNotice(payload string) (instance string, ago time.Duration, ok bool) {
	rest, found := strings.CutPrefix(payload, healthyNotice)
	if !found {
		return "", 0, false
	}
	ms, instance, found := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil || n < 0 || n > int64(math.MaxInt64/time.Millisecond) {
		return "", 0, false
	}
	return instance, time.Duration(n) * time.Millisecond, true
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
	return false, RateWait(float64(n)-tokens, rate), nil
}

// MaxRateWait is the longest RateWait says to wait before asking again.
const MaxRateWait = time.Minute

// RateWait is how long a bucket refilled at rate tokens a second takes to
// gain tokens, at most MaxRateWait: a rate low enough to need longer asks
// again then. Computed whole, a rate of 1e-12 made the wait overflow a
// Duration, negative, and a limit that low asked the database every
// millisecond.
func RateWait(tokens, rate float64) time.Duration {
	secs := tokens / rate
	if !(secs < MaxRateWait.Seconds()) { // also +Inf and NaN
		return MaxRateWait
	}
	return time.Duration(secs * float64(time.Second))
}

// PauseDelivery pauses delivery on every instance until until (zero: until
// resumed), by operator by for reason, and records it in
// forward_operator_log. A pause in force keeps its start and takes the new
// end and reason. It returns the pause's start.
func PauseDelivery(ctx context.Context, q Querier, until time.Time, by, reason string) (time.Time, error) {
	if strings.TrimSpace(by) == "" {
		return time.Time{}, errors.New("pausing delivery: the operator is empty")
	}
	var (
		end   *time.Time
		since time.Time
		logID int64
	)
	if !until.IsZero() {
		end = &until
	}
	if err := q.QueryRow(ctx, deliveryPauseSQL, end, by, CleanText(reason, MaxErrorLen)).Scan(&since, &logID); err != nil {
		return since, fmt.Errorf("pausing delivery: %w", err)
	}
	return since, nil
}

// ResumeDelivery ends the operator's pause now, by operator by, and records
// it. It says whether a pause was in force (nothing is recorded when none
// was).
func ResumeDelivery(ctx context.Context, q Querier, by string) (bool, error) {
	if strings.TrimSpace(by) == "" {
		return false, errors.New("resuming delivery: the operator is empty")
	}
	var (
		was   bool
		logID *int64
	)
	if err := q.QueryRow(ctx, deliveryResumeSQL, by).Scan(&was, &logID); err != nil {
		return false, fmt.Errorf("resuming delivery: %w", err)
	}
	return was, nil
}

// MinPauseDuration is the shortest pause given as a duration: instances
// follow a pause within a second, and one that ended before the database
// recorded it would be refused there.
const MinPauseDuration = time.Second

// ParsePauseEnd reads when a pause should end, as an operator gives it:
// empty (until resumed: the zero time), an RFC 3339 time, or a duration from
// now of at least MinPauseDuration in the syntax of every other duration an
// operator types (ParseDuration: 90m, 2d). The end must be in the future.
func ParsePauseEnd(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if strings.HasPrefix(v, "-") {
		return time.Time{}, fmt.Errorf("the end of the pause %s: a duration must be positive", v)
	}
	d, durErr := ParseDuration(v)
	if durErr == nil {
		if d < MinPauseDuration {
			return time.Time{}, fmt.Errorf("the end of the pause %s: a duration must be at least %s (instances follow a pause within a second)", v, MinPauseDuration)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		if MeantAsDuration(v) {
			return time.Time{}, fmt.Errorf("the end of the pause: %w", durErr)
		}
		return time.Time{}, fmt.Errorf("the end of the pause %q is neither an RFC 3339 time (2026-12-02T06:00:00Z) nor a duration (90m, 2d)", v)
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("the end of the pause %s has passed", v)
	}
	return t, nil
}
