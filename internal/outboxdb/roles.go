package outboxdb

import (
	"context"
	"fmt"
	"strings"
)

// Least privilege (docs/deployment.md, "Roles and grants"): the schema's
// owner migrates it (`forwarder outbox migrate`); the service and the
// console connect as roles with only the table privileges below. The docs
// give them as GRANT statements, and test/e2e TestLeastPrivilegeRoles runs
// those statements and checks that each role ends with exactly these.

// Grant is privileges on one table.
type Grant struct {
	Table      string
	Privileges []string
}

// ServiceGrants are what the service's role needs: the outbox's rows and
// attempt logs (ingest, claims, results, retention), the shared platform
// state (breaker, pauses, rate tokens), the schema version it checks on
// start, and the audit row of the operator commands run in its pods
// (requeue, release, purge).
var ServiceGrants = []Grant{
	{"forward_records", []string{"SELECT", "INSERT", "UPDATE", "DELETE"}},
	{"forward_retry_logs", []string{"SELECT", "INSERT", "DELETE"}},
	{"forward_platform_state", []string{"SELECT", "UPDATE"}},
	{"forward_operator_log", []string{"INSERT"}},
	{"forwarder_schema_migrations", []string{"SELECT"}},
}

// ConsoleReadGrants are what `forwarder outbox console --read-only` (and
// stats, show, find) need: reading every table.
var ConsoleReadGrants = []Grant{
	{"forward_records", []string{"SELECT"}},
	{"forward_retry_logs", []string{"SELECT"}},
	{"forward_platform_state", []string{"SELECT"}},
	{"forward_operator_log", []string{"SELECT"}},
	{"forwarder_schema_migrations", []string{"SELECT"}},
}

// ConsoleActionGrants are what the console's actions add to
// ConsoleReadGrants: a requeue sets rows back to PENDING, logs a REQUEUED
// attempt for each, and leaves an audit row.
var ConsoleActionGrants = []Grant{
	{"forward_records", []string{"UPDATE"}},
	{"forward_retry_logs", []string{"INSERT"}},
	{"forward_operator_log", []string{"INSERT"}},
}

// MissingGrants returns the privileges of grants the connected role lacks,
// each as "INSERT on forward_retry_logs"; a table that does not exist counts
// as lacking them all.
func MissingGrants(ctx context.Context, q Querier, grants []Grant) ([]string, error) {
	var missing []string
	for _, g := range grants {
		for _, p := range g.Privileges {
			var ok bool
			if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), $2)`,
				g.Table, p).Scan(&ok); err != nil {
				return nil, fmt.Errorf("checking the role's privileges: %w", err)
			}
			if !ok {
				missing = append(missing, p+" on "+g.Table)
			}
		}
	}
	return missing, nil
}

// MissingGrantsError is the error of a role without privileges it needs.
func MissingGrantsError(ctx context.Context, q Querier, what string, missing []string) error {
	var role string
	_ = q.QueryRow(ctx, "SELECT current_user::text").Scan(&role)
	return fmt.Errorf("role %s lacks %s, which %s needs: grant it as docs/deployment.md (Roles and grants) shows",
		role, strings.Join(missing, ", "), what)
}
