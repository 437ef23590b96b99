package streamdb

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestMissingStatementFunctionsAreSaidOnce: behind a transaction pooler, a
// service role that may not change the schema cannot make the statement
// functions; the stream says once how many are missing and what to run,
// however many of its components open the database, and an instance
// started once the owner made them finds them all and says nothing.
func TestMissingStatementFunctionsAreSaidOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	serviceDSN := pgtest.ServiceRole(t, dsn)
	// start is an instance starting: a stream of its own, in pooled mode
	// (DATABASE_DIRECT_URL set; here both lead to the database itself).
	start := func(logs *syncBuffer) *DB {
		t.Helper()
		h, err := WithDirect(service.MockResources(), serviceDSN, serviceDSN)
		if err != nil {
			t.Fatal(err)
		}
		h.log = service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		// Three components of the stream: ingest, dispatcher, output.
		for range 3 {
			if _, err := h.Open(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Release)
		}
		return h
	}

	var before syncBuffer
	h := start(&before)
	said := "Database " + h.Database + ": 5 statement functions of this version are missing"
	if n := strings.Count(before.String(), said); n != 1 || !strings.Contains(before.String(), "forwarder outbox migrate") {
		t.Fatalf("logged %d times %q with a run of outbox migrate, want once:\n%s", n, said, before.String())
	}

	owner, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	if made, err := outboxdb.MakeStatementFunctions(ctx, owner); err != nil || made != 5 {
		t.Fatalf("the owner made %d statement functions (%v), want 5", made, err)
	}
	var after syncBuffer
	h = start(&after)
	if strings.Contains(after.String(), "statement functions") {
		t.Fatalf("an instance started once the functions exist says:\n%s", after.String())
	}
	pool, err := h.Retain()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if missing, err := outboxdb.UseStatementFunctions(ctx, pool); err != nil || missing != 0 {
		t.Fatalf("%d statement functions missing for the new instance (%v), want none", missing, err)
	}
}
