package pgtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// privilegesSQL lists what role $1 may do in the public schema, each as
// outboxdb.Grant.Describe names it: every privilege on a table (partitions
// included), view or sequence, and EXECUTE on every function that runs
// with its owner's rights (the others give the caller nothing it has not
// got, and PUBLIC may run them), spelt as PostgreSQL prints it.
const privilegesSQL = `
SELECT p || ' on ' || c.relname
FROM pg_class c, unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v')
  AND has_table_privilege($1, c.oid, p)
UNION ALL
SELECT p || ' on sequence ' || c.relname
FROM pg_class c, unnest(ARRAY['USAGE','SELECT','UPDATE']) p
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S' AND has_sequence_privilege($1, c.oid, p)
UNION ALL
SELECT 'EXECUTE on function ' || f.oid::regprocedure::text
FROM pg_proc f
WHERE f.pronamespace = 'public'::regnamespace AND f.prosecdef AND has_function_privilege($1, f.oid, 'EXECUTE')`

// CheckGrants compares role's privileges in the public schema with grants,
// through q (a connection of a role that may read the catalog): nothing
// missing, nothing more. source names where grants come from, for the
// errors.
func CheckGrants(t testing.TB, q outboxdb.Querier, role, source string, grants []outboxdb.Grant) {
	t.Helper()
	ctx := context.Background()
	role = strings.Trim(role, `"`)
	want := map[string]bool{}
	for _, g := range grants {
		if g.Kind == outboxdb.OnFunction {
			// As PostgreSQL prints it, like the privileges read below.
			if err := q.QueryRow(ctx, `SELECT coalesce(to_regprocedure($1)::text, $1)`, g.Table).Scan(&g.Table); err != nil {
				t.Fatalf("function %s: %v", g.Table, err)
			}
		}
		for _, p := range g.Privileges {
			want[g.Describe(p)] = true
		}
	}
	rows, err := q.Query(ctx, privilegesSQL, role)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		if !want[g] {
			t.Errorf("%s has %s, which %s does not grant it", role, g, source)
		}
		delete(want, g)
	}
	for g := range want {
		t.Errorf("%s lacks %s, which %s grants it", role, g, source)
	}
}
