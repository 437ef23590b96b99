package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Actions recorded in forward_operator_log.
const (
	ActionRequeue = "requeue"
	ActionPurge   = "purge"
)

// OperatorAction is one row of forward_operator_log: who changed which rows.
type OperatorAction struct {
	ID int64 `db:"id"`
	// At is when it was recorded (the database clock).
	At time.Time `db:"at"`
	// Operator names the person: a console user, or --operator / $USER.
	Operator string `db:"operator"`
	// Action is what was done (ActionRequeue, ActionPurge).
	Action string `db:"action"`
	// Filter says which rows, in words ("status=FAILED classes=TRANSIENT").
	Filter string `db:"filter"`
	// Rows is how many rows were changed.
	Rows int64 `db:"rows"`
}

// LogOperatorAction records a. ID and At are filled in by the database.
func LogOperatorAction(ctx context.Context, q Querier, a OperatorAction) (OperatorAction, error) {
	if a.Operator == "" {
		return a, fmt.Errorf("recording %s: the operator is empty", a.Action)
	}
	if err := q.QueryRow(ctx, operatorLogInsertSQL, a.Operator, a.Action, a.Filter, a.Rows).Scan(&a.ID, &a.At); err != nil {
		return a, fmt.Errorf("recording %s by %s in forward_operator_log: %w", a.Action, a.Operator, err)
	}
	return a, nil
}

// RecentOperatorActions returns the latest limit actions, newest first.
func RecentOperatorActions(ctx context.Context, q Querier, limit int) ([]OperatorAction, error) {
	rows, err := q.Query(ctx, operatorLogRecentSQL, limit)
	if err != nil {
		return nil, fmt.Errorf("reading forward_operator_log: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[OperatorAction])
}
