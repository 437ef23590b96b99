package pgtest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// LoginRole creates a role (a unique name starting with prefix) that logs
// in without a password (the test server trusts local connections),
// dropped at the end of the test with everything granted to it in the
// database of dsn. It returns the role's name, quoted.
func LoginRole(t testing.TB, dsn, prefix string) string {
	t.Helper()
	ctx := context.Background()
	name := strings.ToLower(prefix + "_" + strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))
	if len(name) > 60 {
		name = name[:60]
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+ident+"; CREATE ROLE "+ident+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP OWNED BY "+ident+"; DROP ROLE "+ident)
	})
	return ident
}

// AsRole is dsn with its user replaced by role.
func AsRole(t testing.TB, dsn, role string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(strings.Trim(role, `"`))
	return u.String()
}

// OwnerGrantBlocks are the two SQL blocks of docs/deployment.md that the
// schema's owner runs to grant the service and console roles their
// rights: the service's and the read-only console's, then the console's
// actions.
func OwnerGrantBlocks(t testing.TB) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(testinputs.ModuleRoot(t), "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)<!-- roles: owner, forwarder -->\n```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) != 2 {
		t.Fatalf("found %d grant blocks run as the owner in docs/deployment.md, want 2", len(blocks))
	}
	return blocks
}

// RunGrants runs a block of the docs with the test's roles in place of
// forwarder_service and forwarder_console (roles are shared by the tests of
// the server; names of their own keep them apart).
func RunGrants(t testing.TB, owner *pgxpool.Pool, block, service, console string) {
	t.Helper()
	sql := strings.NewReplacer("forwarder_service", service, "forwarder_console", console).Replace(block)
	if _, err := owner.Exec(context.Background(), sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("the grants of docs/deployment.md: %v\n%s", err, sql)
	}
}

// ServiceRole creates a service role with the grants docs/deployment.md
// gives it on the migrated database of dsn, whose role owns the schema, and
// returns its connection string.
func ServiceRole(t testing.TB, dsn string) string {
	t.Helper()
	owner := openPool(t, dsn)
	service := LoginRole(t, dsn, "svc")
	RunGrants(t, owner, OwnerGrantBlocks(t)[0], service, LoginRole(t, dsn, "con"))
	return AsRole(t, dsn, service)
}
