package outboxdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statement functions (docs/deployment.md, "PgBouncer"). Behind a
// transaction pooler (PoolConfig.Pooled) statements are sent unnamed, so
// PostgreSQL plans each one at every execution: at a steady rate, with a few
// dozen rows a statement, that planning was most of PostgreSQL's work
// (docs/benchmarks.md, "Pooled statements at a steady rate"). The statements
// of the two transactions every message goes through (the insert's and the
// result write's) therefore run there through PL/pgSQL functions that wrap
// them unchanged: PL/pgSQL keeps its statements' plans for the server
// session, and a transaction pooler keeps server sessions (it moves
// transactions between them, not them away). The functions are made by the
// schema's owner (MakeStatementFunctions: `outbox migrate`, or the service
// on start when it may migrate); a pool whose database lacks them sends the
// statements themselves.

// pooledStatements are the statements run through functions behind a
// pooler: what the insert and the result write send (see pipeline).
var pooledStatements = []struct{ name, sql string }{
	{"insert", insertSQL},
	{"insert_backstop", insertBackstopSQL},
	{"order_lock_active", orderLockActiveSQL},
	{"record", recordSQL},
	{"order_lock", orderLockSQL},
}

// statementFunction names the function of a statement: by a hash of its
// text and of the schema version, so that the functions of two versions of
// the forwarder, whose statements differ, exist side by side while one
// replaces the other, and a migration that changes a column's type (and
// so a function's declared result) without changing the text gets new ones.
func statementFunction(name, sql string) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("schema %d\n%s", LatestVersion(), sql)))
	return "forward_stmt_" + name + "_" + hex.EncodeToString(sum[:6])
}

// MakeStatementFunctions creates, on conn (a session of a role that may
// change the schema, at the latest version), the functions of this binary's
// statements that do not exist yet, and returns how many it made. Each
// statement is described for its parameter and result types and wrapped
// unchanged; the function runs with the caller's rights (SECURITY INVOKER)
// and with the settings a direct connection gives the service's sessions
// (enable_seqscan and jit off: docs/deployment.md).
func MakeStatementFunctions(ctx context.Context, conn *pgx.Conn) (int, error) {
	made := 0
	for _, st := range pooledStatements {
		fn := statementFunction(st.name, st.sql)
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_proc
			WHERE proname = $1 AND pronamespace = current_schema()::regnamespace)`, fn).Scan(&exists); err != nil {
			return made, fmt.Errorf("looking for statement function %s: %w", fn, err)
		}
		if exists {
			continue
		}
		ddl, err := statementFunctionDDL(ctx, conn, fn, st.sql)
		if err != nil {
			return made, fmt.Errorf("describing statement %s: %w", st.name, err)
		}
		if _, err := conn.Exec(ctx, ddl); err != nil {
			var pgErr *pgconn.PgError
			// Made by another instance meanwhile: duplicate_function, or
			// unique_violation when both created it at once.
			if errors.As(err, &pgErr) && (pgErr.Code == "42723" || pgErr.Code == "23505") {
				continue
			}
			return made, fmt.Errorf("creating statement function %s: %w", fn, err)
		}
		made++
	}
	return made, nil
}

// OtherStatementFunctions lists, on conn, the statement functions of the
// current schema that are not this binary's: those of the other versions
// of the forwarder that have run against the database (each version makes
// its own, so that two run side by side during an upgrade). Each is given
// as its signature, as PostgreSQL writes it (regprocedure).
func OtherStatementFunctions(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	ours := make([]string, len(pooledStatements))
	for i, st := range pooledStatements {
		ours[i] = statementFunction(st.name, st.sql)
	}
	rows, err := conn.Query(ctx, `SELECT oid::regprocedure::text FROM pg_proc
		WHERE pronamespace = current_schema()::regnamespace AND proname LIKE 'forward\_stmt\_%'
			AND proname <> ALL ($1) ORDER BY proname`, ours)
	if err != nil {
		return nil, fmt.Errorf("looking for other versions' statement functions: %w", err)
	}
	sigs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("looking for other versions' statement functions: %w", err)
	}
	return sigs, nil
}

// DropStatementFunctions drops the functions sigs names, as
// OtherStatementFunctions gives them (PostgreSQL's own quoting), on conn, a
// session of the schema's owner. An instance still calling one fails that
// call once and sends its statements themselves from then on
// (ErrStatementFunctionMissing): delivery goes on.
func DropStatementFunctions(ctx context.Context, conn *pgx.Conn, sigs []string) error {
	for _, sig := range sigs {
		if _, err := conn.Exec(ctx, "DROP FUNCTION IF EXISTS "+sig); err != nil {
			return fmt.Errorf("dropping statement function %s: %w", sig, err)
		}
	}
	return nil
}

// dollarTag quotes the function's body; no statement contains it.
const dollarTag = "$forward_stmt$"

func statementFunctionDDL(ctx context.Context, conn *pgx.Conn, fn, sql string) (string, error) {
	if strings.Contains(sql, dollarTag) {
		return "", fmt.Errorf("the statement contains %s", dollarTag)
	}
	sd, err := conn.Prepare(ctx, "", sql)
	if err != nil {
		return "", err
	}
	typeName := func(oid uint32) (string, error) {
		var s string
		err := conn.QueryRow(ctx, "SELECT format_type($1::oid, NULL)", oid).Scan(&s)
		return s, err
	}
	params := make([]string, len(sd.ParamOIDs))
	for i, oid := range sd.ParamOIDs {
		if params[i], err = typeName(oid); err != nil {
			return "", err
		}
	}
	if len(sd.Fields) == 0 {
		return "", errors.New("it returns no rows")
	}
	// The result columns keep the statement's names, rows being read by
	// name; a name repeated (in results only executed) gets a suffix.
	cols := make([]string, len(sd.Fields))
	seen := map[string]bool{}
	for i, f := range sd.Fields {
		t, err := typeName(f.DataTypeOID)
		if err != nil {
			return "", err
		}
		name := f.Name
		if seen[name] {
			name = fmt.Sprintf("%s_%d", name, i+1)
		}
		seen[name] = true
		cols[i] = pgx.Identifier{name}.Sanitize() + " " + t
	}
	// use_column: the result columns are PL/pgSQL variables too; the
	// statement's names mean its columns, as at top level.
	return fmt.Sprintf("CREATE FUNCTION %s(%s) RETURNS TABLE(%s) LANGUAGE plpgsql VOLATILE SECURITY INVOKER\n"+
		"SET enable_seqscan = off SET jit = off SET plan_cache_mode = auto\nAS %s\n#variable_conflict use_column\nBEGIN\nRETURN QUERY %s;\nEND\n%s",
		pgx.Identifier{fn}.Sanitize(), strings.Join(params, ", "), strings.Join(cols, ", "), dollarTag,
		strings.TrimRight(strings.TrimSpace(sql), ";"), dollarTag), nil
}

// pooledCalls maps, per database (a pooled pool's connection string), each
// statement to the call of its function; pooledDatabases counts them, so
// that pipeline looks nothing up on direct connections.
var (
	pooledCalls     sync.Map // string → map[string]string
	pooledDatabases atomic.Int32
)

// UseStatementFunctions makes pool, a pooled one, run its statements
// through their functions where they exist, and returns how many are
// missing (those statements are sent as they are).
func UseStatementFunctions(ctx context.Context, pool *pgxpool.Pool) (missing int, err error) {
	names := make([]string, len(pooledStatements))
	for i, st := range pooledStatements {
		names[i] = statementFunction(st.name, st.sql)
	}
	rows, err := pool.Query(ctx, `SELECT proname::text, pronargs FROM pg_proc
		WHERE proname = ANY ($1) AND pronamespace = current_schema()::regnamespace`, names)
	if err != nil {
		return len(names), fmt.Errorf("looking for the statement functions: %w", err)
	}
	nargs := map[string]int{}
	var name string
	var n int16
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { nargs[name] = int(n); return nil }); err != nil {
		return len(names), fmt.Errorf("looking for the statement functions: %w", err)
	}
	calls := map[string]string{}
	for i, st := range pooledStatements {
		n, ok := nargs[names[i]]
		if !ok {
			missing++
			continue
		}
		args := make([]string, n)
		for j := range args {
			args[j] = fmt.Sprintf("$%d", j+1)
		}
		calls[st.sql] = "SELECT * FROM " + pgx.Identifier{names[i]}.Sanitize() + "(" + strings.Join(args, ", ") + ")"
	}
	if _, loaded := pooledCalls.Swap(pool.Config().ConnConfig.ConnString(), calls); !loaded {
		pooledDatabases.Add(1)
	}
	return missing, nil
}

// viaFunctions replaces the statements of one pipeline on q by their
// functions' calls when q leads to a pooler whose database has them.
func viaFunctions(q Querier, sqls ...*string) {
	database, ok := pooledDatabase(q)
	if !ok {
		return
	}
	v, ok := pooledCalls.Load(database)
	if !ok {
		return
	}
	calls := v.(map[string]string)
	for _, s := range sqls {
		if call, ok := calls[*s]; ok {
			*s = call
		}
	}
}

// pooledDatabase is the key of q's database in pooledCalls; false when no
// pooled pool uses statement functions, or q is of no known kind.
func pooledDatabase(q Querier) (string, bool) {
	if pooledDatabases.Load() == 0 {
		return "", false
	}
	var cfg *pgx.ConnConfig
	switch v := q.(type) {
	case *pgxpool.Pool:
		cfg = v.Config().ConnConfig
	case pgx.Tx:
		cfg = v.Conn().Config()
	case *pgxpool.Conn:
		cfg = v.Conn().Config()
	case *pgx.Conn:
		cfg = v.Config()
	default:
		return "", false
	}
	return cfg.ConnString(), true
}

// ErrStatementFunctionMissing: a statement function the pool called is
// gone (dropped since the pool looked them up, with older versions' for
// instance). Every later call on that database sends the statements
// themselves, so delivery goes on; `outbox migrate` makes the functions
// again, and an instance started after it uses them.
var ErrStatementFunctionMissing = errors.New("a statement function is missing: the statements themselves are sent from now on (`forwarder outbox migrate` makes the functions again; docs/deployment.md, PgBouncer)")

// fallBackFromFunctions returns err, the error of a pipeline on q, or,
// when a statement function it called does not exist, err marked with
// ErrStatementFunctionMissing, and q's database no longer calls them.
func fallBackFromFunctions(q Querier, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42883" || !strings.Contains(pgErr.Message, "forward_stmt_") {
		return err
	}
	if database, ok := pooledDatabase(q); ok {
		pooledCalls.Store(database, map[string]string{})
	}
	return fmt.Errorf("%w: %w", ErrStatementFunctionMissing, err)
}
