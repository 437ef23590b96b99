package outboxdb

import (
	"context"
	"fmt"
	"strings"
)

// Least privilege (docs/deployment.md, "Roles and grants"): the schema's
// owner migrates it (`forwarder outbox migrate`); the service and the
// console connect as roles with only the privileges below. The docs give
// them as GRANT statements; TestRoleGrants (internal/outboxdb) and test/e2e
// TestLeastPrivilegeRoles run those statements and check that each role
// ends with exactly these, and that they are enough.

// Grant is privileges on one table or view (Kind ""), sequence or function.
type Grant struct {
	// Table names the object; a function with its argument types, as
	// GRANT and to_regprocedure spell it.
	Table      string
	Privileges []string
	Kind       GrantKind
}

// GrantKind is the kind of object a Grant is on.
type GrantKind string

// The kinds of Grant.
const (
	OnTable    GrantKind = ""
	OnSequence GrantKind = "SEQUENCE"
	OnFunction GrantKind = "FUNCTION"
)

// PartitionEnsureFunction creates the partitions of messages and attempts
// as the schema's owner (SECURITY DEFINER, migration 0005), so that the
// service's role needs no DDL rights.
const PartitionEnsureFunction = "forward_partition_ensure(timestamptz, timestamptz, interval)"

// PartitionRetireFunction drops a finished day's partitions as the schema's
// owner (SECURITY DEFINER, migration 0005): retention and `outbox purge`
// retire days without DDL rights.
const PartitionRetireFunction = "forward_partition_retire(timestamptz, timestamptz, boolean, text, text, integer, integer)"

// DeliveryPauseFunction and DeliveryResumeFunction change the operator's
// pause of delivery and record who did, as the schema's owner (SECURITY
// DEFINER, migration 0006): the roles that may pause need no UPDATE on the
// rest of the platform's shared state.
const (
	DeliveryPauseFunction  = "forward_delivery_pause(timestamptz, text, text)"
	DeliveryResumeFunction = "forward_delivery_resume(text)"
)

// ServiceGrants are what the service's role needs: messages written once
// and read (insert, dedupe, claims), their delivery state (claims, results,
// ordering, compensation, dead letters), the attempt log, the partitions it
// creates ahead through PartitionEnsureFunction and retires through
// PartitionRetireFunction, the message ids
// (forward_messages_id_seq; the attempt log's id is an identity column,
// which needs no grant), the view the operator commands read, the shared
// platform state (breaker, pauses, rate tokens), the schema version it
// checks on start, and the audit row of the operator commands run in its
// pods (requeue, release, purge, pause and resume).
var ServiceGrants = []Grant{
	{Table: "forward_messages", Privileges: []string{"SELECT", "INSERT"}},
	{Table: "forward_deliveries", Privileges: []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
	{Table: "forward_retry_logs", Privileges: []string{"SELECT", "INSERT"}},
	{Table: "forward_partitions", Privileges: []string{"SELECT"}},
	{Table: "forward_records", Privileges: []string{"SELECT"}},
	{Table: "forward_platform_state", Privileges: []string{"SELECT", "UPDATE"}},
	// SELECT too: the audit row is inserted RETURNING id, at, which reads
	// them.
	{Table: "forward_operator_log", Privileges: []string{"SELECT", "INSERT"}},
	{Table: "forwarder_schema_migrations", Privileges: []string{"SELECT"}},
	{Table: "forward_messages_id_seq", Privileges: []string{"USAGE"}, Kind: OnSequence},
	{Table: PartitionEnsureFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
	{Table: PartitionRetireFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
	{Table: DeliveryPauseFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
	{Table: DeliveryResumeFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
}

// ConsoleReadGrants are what `forwarder outbox console --read-only` (and
// stats, show, find) need: reading every table and the view.
var ConsoleReadGrants = []Grant{
	{Table: "forward_messages", Privileges: []string{"SELECT"}},
	{Table: "forward_deliveries", Privileges: []string{"SELECT"}},
	{Table: "forward_retry_logs", Privileges: []string{"SELECT"}},
	{Table: "forward_partitions", Privileges: []string{"SELECT"}},
	{Table: "forward_records", Privileges: []string{"SELECT"}},
	{Table: "forward_platform_state", Privileges: []string{"SELECT"}},
	{Table: "forward_operator_log", Privileges: []string{"SELECT"}},
	{Table: "forwarder_schema_migrations", Privileges: []string{"SELECT"}},
}

// ConsoleActionGrants are what the console's actions add to
// ConsoleReadGrants: a requeue sets delivery rows back to PENDING (gives a
// delivered message a delivery row again), logs a REQUEUED attempt for
// each, and leaves an audit row; pause and resume go through their
// functions.
var ConsoleActionGrants = []Grant{
	{Table: "forward_deliveries", Privileges: []string{"INSERT", "UPDATE"}},
	{Table: "forward_retry_logs", Privileges: []string{"INSERT"}},
	{Table: "forward_operator_log", Privileges: []string{"INSERT"}},
	{Table: DeliveryPauseFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
	{Table: DeliveryResumeFunction, Privileges: []string{"EXECUTE"}, Kind: OnFunction},
}

// missingGrantSQL says whether the connected role holds privilege $2 on
// object $1, per kind; an object that does not exist counts as not held.
var missingGrantSQL = map[GrantKind]string{
	OnTable:    `SELECT to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), $2)`,
	OnSequence: `SELECT to_regclass($1) IS NOT NULL AND has_sequence_privilege(to_regclass($1), $2)`,
	OnFunction: `SELECT to_regprocedure($1) IS NOT NULL AND has_function_privilege(to_regprocedure($1), $2)`,
}

// MissingGrants returns the privileges of grants the connected role lacks,
// each as "INSERT on forward_retry_logs" ("USAGE on sequence ...", "EXECUTE
// on function ..."); an object that does not exist counts as lacking them
// all.
func MissingGrants(ctx context.Context, q Querier, grants []Grant) ([]string, error) {
	var missing []string
	for _, g := range grants {
		sql, known := missingGrantSQL[g.Kind]
		if !known {
			return nil, fmt.Errorf("checking the role's privileges: unknown kind %q of %s", g.Kind, g.Table)
		}
		for _, p := range g.Privileges {
			var ok bool
			if err := q.QueryRow(ctx, sql, g.Table, p).Scan(&ok); err != nil {
				return nil, fmt.Errorf("checking the role's privileges: %w", err)
			}
			if !ok {
				missing = append(missing, g.Describe(p))
			}
		}
	}
	return missing, nil
}

// Describe names privilege p on g's object: "INSERT on forward_retry_logs",
// "USAGE on sequence forward_messages_id_seq".
func (g Grant) Describe(p string) string {
	if g.Kind == OnTable {
		return p + " on " + g.Table
	}
	return p + " on " + strings.ToLower(string(g.Kind)) + " " + g.Table
}

// MissingGrantsError is the error of a role without privileges it needs.
func MissingGrantsError(ctx context.Context, q Querier, what string, missing []string) error {
	var role string
	_ = q.QueryRow(ctx, "SELECT current_user::text").Scan(&role)
	return fmt.Errorf("role %s lacks %s, which %s needs: grant it as docs/deployment.md (Roles and grants) shows",
		role, strings.Join(missing, ", "), what)
}
