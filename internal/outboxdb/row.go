package outboxdb

import "time"

// Record is a message as forward_records shows it: the immutable message
// and its delivery state, or, once delivered, its last attempt
// (docs/architecture.md, "Database: the data model"). It is the one row
// type of the package: claims, lookups, the dead-letter input and the
// tests read it by column name (pgx.RowToStructByNameLax), so a statement
// returns the columns it has and the others stay zero.
type Record struct {
	ID             int64      `db:"id" json:"id"`
	MessageKey     string     `db:"message_key" json:"message_key"`
	APIType        string     `db:"api_type" json:"api_type"`
	KafkaTopic     string     `db:"kafka_topic" json:"kafka_topic"`
	KafkaPartition int32      `db:"kafka_partition" json:"kafka_partition"`
	KafkaOffset    int64      `db:"kafka_offset" json:"kafka_offset"`
	KafkaKey       []byte     `db:"kafka_key" json:"-"`
	Payload        []byte     `db:"payload" json:"-"`
	Status         Status     `db:"status" json:"status"`
	AttemptCount   int        `db:"attempt_count" json:"attempt_count"`
	NextRetryAt    *time.Time `db:"next_retry_at" json:"next_retry_at"`
	LastHTTPStatus *int32     `db:"last_http_status" json:"last_http_status"`
	LastError      *string    `db:"last_error" json:"last_error"`
	CreatedAt      time.Time  `db:"created_at" json:"created_at"`
	UpdatedAt      time.Time  `db:"updated_at" json:"updated_at"`
	SucceededAt    *time.Time `db:"succeeded_at" json:"succeeded_at"`
	// ClaimToken fences every write for the current claim (result,
	// release); "" when the row is not claimed. Statements that return it
	// read coalesce(claim_token::text, '').
	ClaimToken     string     `db:"claim_token" json:"-"`
	ClaimedBy      *string    `db:"claimed_by" json:"claimed_by"`
	ClaimedAt      *time.Time `db:"claimed_at" json:"claimed_at"`
	FailureClass   *string    `db:"failure_class" json:"failure_class"`
	FailedAt       *time.Time `db:"failed_at" json:"failed_at"`
	RequeueRounds  int        `db:"requeue_rounds" json:"requeue_rounds"`
	LeaseReturns   int        `db:"lease_returns" json:"lease_returns"`
	OrderingKey    *string    `db:"ordering_key" json:"ordering_key"`
	OrderHeld      bool       `db:"order_held" json:"order_held"`
	OrderBlocked   bool       `db:"order_blocked" json:"order_blocked"`
	PlateNo        *string    `db:"plate_no" json:"plate_no"`
	ParkCode       *string    `db:"park_code" json:"park_code"`
	BerthCode      *string    `db:"berth_code" json:"berth_code"`
	DeviceID       *string    `db:"device_id" json:"device_id"`
	DeadLetteredAt *time.Time `db:"dead_lettered_at" json:"dead_lettered_at"`
	// DeadLetterToken fences the dead-letter topic's claim of a FAILED row
	// (ClaimDeadLetters); "" when none.
	DeadLetterToken string `db:"dead_letter_token" json:"-"`
	// PreviousFailureAt is when a failed attempt last sent the row back to
	// PENDING, on whichever instance (database clock); nil when it has not
	// failed. Claims return it, for the platform's protection to tell a
	// message failing again during an outage from one failing on its own.
	PreviousFailureAt *time.Time `db:"previous_failure_at" json:"-"`
	// TraceParent is the W3C traceparent the message was inserted under
	// (docs/operations.md, "Tracing"); nil when it was inserted without
	// tracing. Claims return it.
	TraceParent *string `db:"trace_parent" json:"-"`
}

// Ref identifies the current claim of the row for a fenced write.
func (r Record) Ref() ClaimRef { return ClaimRef{ID: r.ID, ClaimToken: r.ClaimToken} }

// DeadLetterRef identifies the dead-letter claim of the row for
// MarkDeadLettered and ReleaseDeadLetters.
func (r Record) DeadLetterRef() DeadLetterRef {
	return DeadLetterRef{ID: r.ID, Token: r.DeadLetterToken}
}

// LeaseExpiresAt is when the claim of an IN_PROGRESS row ends: its
// next_retry_at. Zero when the row has none.
func (r Record) LeaseExpiresAt() time.Time {
	if r.NextRetryAt == nil {
		return time.Time{}
	}
	return *r.NextRetryAt
}

// LastErrorText is last_error, "" when there is none.
func (r Record) LastErrorText() string { return textOrEmpty(r.LastError) }
