package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// RateCap is how many rows each side of ReadRates reads at most.
const RateCap = 200_000

// FailedGroupsCap is how many FAILED rows (the most recently failed)
// FailedGroups reads at most.
const FailedGroupsCap = 100_000

// PlatformView is the row of forward_platform_state as the console shows it.
type PlatformView struct {
	// Breaker is CLOSED, OPEN or HALF_OPEN ("" when the table has no row).
	Breaker     string
	ChangedAt   *time.Time
	ChangedBy   *string
	Reason      *string
	NextProbeAt *time.Time
	// PausedUntil is set only while a Retry-After pause is in force (the
	// column holds its last end, 'epoch' when there never was one).
	PausedUntil *time.Time
	// Pause is the operator's pause of delivery, the latest one; its
	// Left is not filled in.
	Pause DeliveryPause
}

// SharedState is the breaker and the ordering state.
type SharedState struct {
	Platform PlatformView
	// HeldRows are PENDING rows waiting for an earlier row of their key.
	HeldRows int64
	// BlockedKeys are ordering keys held by a FAILED row.
	BlockedKeys int64
	// Now is the database clock.
	Now time.Time
}

// ReadSharedState reads the breaker and the ordering counts.
func ReadSharedState(ctx context.Context, q Querier) (SharedState, error) {
	var s SharedState
	var breaker *string
	var paused pgtype.Timestamptz
	var pauseSince, pauseUntil *time.Time
	p := &s.Platform.Pause
	err := q.QueryRow(ctx, consoleStateSQL).Scan(&breaker, &s.Platform.ChangedAt, &s.Platform.ChangedBy,
		&s.Platform.Reason, &s.Platform.NextProbeAt, &paused, &pauseSince, &pauseUntil, &p.By, &p.Reason, &p.InForce,
		&s.HeldRows, &s.BlockedKeys, &s.Now)
	if err != nil {
		return s, fmt.Errorf("reading the breaker and ordering state: %w", err)
	}
	if breaker != nil {
		s.Platform.Breaker = *breaker
	}
	// A pause that ended (or the 'epoch' of one that never began) is not
	// one: only a pause still in force on the database clock is reported.
	if paused.Valid && paused.InfinityModifier == pgtype.Finite && paused.Time.After(s.Now) {
		s.Platform.PausedUntil = &paused.Time
	}
	if pauseSince != nil {
		p.Since = *pauseSince
	}
	if pauseUntil != nil {
		p.Until = *pauseUntil
	}
	return s, nil
}

// Rates are what happened recently (ReadRates).
type Rates struct {
	// Created counts rows persisted in the last minute and ten minutes.
	Created1m, Created10m int64
	// Delivered counts attempts that ended SUCCESS; Failed those that ended
	// PENDING (a retry) or FAILED.
	Delivered1m, Delivered10m int64
	Failed1m, Failed10m       int64
	// CreatedCapped and AttemptsCapped are set when the ten-minute figures
	// are lower bounds (RateCap rows were read before ten minutes back).
	CreatedCapped, AttemptsCapped bool
}

// ReadRates counts recent rows and attempts (console_rates.sql).
func ReadRates(ctx context.Context, q Querier) (Rates, error) {
	return readRates(ctx, q, RateCap)
}

func readRates(ctx context.Context, q Querier, limit int) (Rates, error) {
	var r Rates
	var capped *bool
	err := q.QueryRow(ctx, consoleRatesSQL, limit).Scan(&r.Created1m, &r.Created10m, &r.CreatedCapped,
		&r.Delivered1m, &r.Delivered10m, &r.Failed1m, &r.Failed10m, &capped)
	if err != nil {
		return r, fmt.Errorf("reading recent rates: %w", err)
	}
	r.AttemptsCapped = capped != nil && *capped
	return r, nil
}

// OldestUnfinished returns the oldest PENDING or IN_PROGRESS row that is not
// held behind another (as `outbox stats` shows it), nil when there is none.
func OldestUnfinished(ctx context.Context, q Querier) (*OldestRow, error) {
	var o OldestRow
	var status string
	var dbNow time.Time
	err := q.QueryRow(ctx, statsOldestSQL).Scan(&o.ID, &o.MessageKey, &status, &o.CreatedAt, &dbNow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("finding the oldest undelivered row: %w", err)
	}
	o.Status = Status(status)
	o.Age = dbNow.Sub(o.CreatedAt)
	return &o, nil
}

// FailedGroup is a set of FAILED rows with the same class and reason.
type FailedGroup struct {
	// Class is the failure class ("" for rows from before classes existed).
	Class string `db:"class"`
	// Reason is last_error normalised (console_failed_groups.sql): pass it
	// as RequeueFilter.Reason to requeue the group.
	Reason       string    `db:"reason"`
	Rows         int64     `db:"rows"`
	LastFailedAt time.Time `db:"last_failed_at"`
	// NewestID is the group's newest row, an example to look at.
	NewestID int64 `db:"newest_id"`
}

// FailedGroups returns the largest groups of FAILED rows, at most limit,
// among the FailedGroupsCap most recently failed.
func FailedGroups(ctx context.Context, q Querier, limit int) ([]FailedGroup, error) {
	return queryAll(ctx, q, "grouping FAILED rows", failedGroupsSQL, pgx.RowToStructByName[FailedGroup], limit, FailedGroupsCap)
}

// FailedByClass counts FAILED rows by class ("" for rows without one).
func FailedByClass(ctx context.Context, q Querier) ([]ValueCount, error) {
	return queryAll(ctx, q, "counting FAILED rows by class", failedClassesSQL, scanValueCount)
}
