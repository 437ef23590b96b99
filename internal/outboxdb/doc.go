// Package outboxdb holds the forwarder's database layer: the connection pool,
// the embedded schema migrations and the SQL of the outbox (persist, claim,
// record results, gauges, operator commands).
//
// It does not import Benthos, so it can be tested as a plain database layer.
// Every query lives in an embedded .sql file under sql/; values are always
// parameters.
package outboxdb

// Status is the life-cycle state of a forward_records row.
type Status string

// Row statuses (docs/architecture.md#database).
const (
	StatusPending    Status = "PENDING"
	StatusInProgress Status = "IN_PROGRESS"
	StatusSuccess    Status = "SUCCESS"
	StatusFailed     Status = "FAILED"
)

// API types of forward_records.api_type.
const (
	APITypeVehicleEvent = "VEHICLE_EVENT"
	APITypeHeartbeat    = "HEARTBEAT"
)

// NotifyChannel is the LISTEN/NOTIFY channel on which new due rows are
// announced to the dispatchers.
const NotifyChannel = "forwarder_outbox"
