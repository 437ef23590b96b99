package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var claimSQL = mustSQL("claim.sql")

// ClaimedRow is a row handed to a dispatcher by Claim.
type ClaimedRow struct {
	ID             int64     `db:"id"`
	MessageKey     string    `db:"message_key"`
	APIType        string    `db:"api_type"`
	KafkaTopic     string    `db:"kafka_topic"`
	KafkaPartition int32     `db:"kafka_partition"`
	KafkaOffset    int64     `db:"kafka_offset"`
	KafkaKey       []byte    `db:"kafka_key"`
	Payload        []byte    `db:"payload"`
	AttemptCount   int       `db:"attempt_count"`
	ClaimToken     string    `db:"claim_token"`
	CreatedAt      time.Time `db:"created_at"`
	LeaseExpiresAt time.Time `db:"lease_expires_at"`
}

// ClaimSQL is the claim statement, exported for plan tests.
func ClaimSQL() string { return claimSQL }

// Claim takes up to limit due rows for claimer, leasing them for lease. The
// rows come back IN_PROGRESS with a fresh claim token and attempt_count
// already counting this attempt.
func Claim(ctx context.Context, q Querier, limit int, lease time.Duration, claimer string) ([]ClaimedRow, error) {
	rows, err := q.Query(ctx, claimSQL, limit, lease.Milliseconds(), claimer)
	if err != nil {
		return nil, fmt.Errorf("claiming due rows: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByName[ClaimedRow])
	if err != nil {
		return nil, fmt.Errorf("claiming due rows: %w", err)
	}
	return claimed, nil
}
