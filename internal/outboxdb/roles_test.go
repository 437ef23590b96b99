package outboxdb_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestRoleGrants runs the grants of docs/deployment.md ("Roles and
// grants"), as written there, on a schema-5 database, for a service role, a
// read-only console role (the first block only) and a console role with its
// actions (both blocks). Each role ends with exactly the privileges outboxdb
// lists (every table, view and sequence of the schema and every SECURITY
// DEFINER function compared, so a grant the docs forget or add fails), and
// no DDL right. Then the grants are shown to be enough: as the service's
// role, the whole delivery path (partitions created ahead, inserts with
// ordering keys, claims, retries, failures that block a key, renewals,
// give-backs, dead letters, compensation, the breaker's state, requeues,
// stats, gauges, find) runs without a permission error; the read-only
// console reads and is refused a requeue; the console with its actions
// requeues a FAILED row and a delivered one. Without USAGE on the message
// id sequence the service cannot insert, and says so on start.
func TestRoleGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewEmptyDB(t)
	owner := openPool(t, dsn)
	migrateTo(t, owner, mustMigrations(t))

	service := pgtest.LoginRole(t, dsn, "svc")
	consoleRO := pgtest.LoginRole(t, dsn, "con_ro")
	consoleRW := pgtest.LoginRole(t, dsn, "con_rw")
	blocks := pgtest.OwnerGrantBlocks(t)
	pgtest.RunGrants(t, owner, blocks[0], service, consoleRO)
	pgtest.RunGrants(t, owner, blocks[0], service, consoleRW)
	pgtest.RunGrants(t, owner, blocks[1], service, consoleRW)

	want := map[string][]outboxdb.Grant{
		service:   outboxdb.ServiceGrants,
		consoleRO: outboxdb.ConsoleReadGrants,
		consoleRW: append(slices.Clone(outboxdb.ConsoleReadGrants), outboxdb.ConsoleActionGrants...),
	}
	for role, grants := range want {
		checkExactPrivileges(t, owner, role, grants)
	}

	svc := openPool(t, pgtest.AsRole(t, dsn, service))
	ro := openPool(t, pgtest.AsRole(t, dsn, consoleRO))
	rw := openPool(t, pgtest.AsRole(t, dsn, consoleRW))
	for role, pool := range map[string]*pgxpool.Pool{service: svc, consoleRO: ro, consoleRW: rw} {
		if missing, err := outboxdb.MissingGrants(ctx, pool, want[role]); err != nil || len(missing) > 0 {
			t.Errorf("%s: MissingGrants says %v (%v), want nothing missing", role, missing, err)
		}
	}

	t.Run("TheServiceDeliversWithItsGrants", func(t *testing.T) {
		noPermissionError := func(what string, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("as the service's role, %s: %v", what, err)
			}
		}
		if err := outboxdb.EnsureSchema(ctx, svc, nil); err != nil {
			t.Fatalf("the service's schema check: %v", err)
		}
		var created int
		noPermissionError("creating partitions ahead", svc.QueryRow(ctx,
			`SELECT forward_partition_ensure(now(), now() + interval '40 days', interval '1 day')`).Scan(&created))
		if created == 0 {
			t.Errorf("forward_partition_ensure created no partition 40 days ahead")
		}
		var recs []outboxdb.NewRecord
		for i := range 40 {
			r := pendingRec("role-"+strings.Repeat("k", 1+i%3)+"-"+string(rune('a'+i)), int64(i))
			r.PlateNo, r.ParkCode, r.BerthCode = "P-1", "PARK", "B"+string(rune('0'+i%4))
			r.OrderingKey = "PARK/" + r.BerthCode
			recs = append(recs, r)
		}
		orderingKeyOf := map[string]string{}
		for _, r := range recs {
			orderingKeyOf[r.MessageKey] = r.OrderingKey
		}
		c, err := outboxdb.InsertBatchCount(ctx, svc, recs)
		noPermissionError("inserting", err)
		if n := c.Pending + c.Failed; n != len(recs) {
			t.Fatalf("inserted %d of %d", n, len(recs))
		}
		_, err = outboxdb.InsertBatchCount(ctx, svc, recs[:3])
		noPermissionError("inserting duplicates", err)

		claimed, err := outboxdb.Claim(ctx, svc, 10, time.Minute, "svc-1")
		noPermissionError("claiming", err)
		if len(claimed) != 4 {
			t.Fatalf("claimed %d rows, want the 4 heads of the 4 berths", len(claimed))
		}
		refs := make([]outboxdb.ClaimRef, len(claimed))
		for i, r := range claimed {
			refs[i] = outboxdb.ClaimRef{ID: r.ID, ClaimToken: r.ClaimToken}
		}
		_, err = outboxdb.RenewLeases(ctx, svc, refs, time.Minute)
		noPermissionError("renewing leases", err)
		_, err = outboxdb.SettledClaims(ctx, svc, refs, "svc-1")
		noPermissionError("reading settled claims", err)
		_, err = outboxdb.Release(ctx, svc, refs[3:], 0, "shutting down")
		noPermissionError("giving a claim back", err)
		_, err = outboxdb.RecordResults(ctx, svc, []outboxdb.Result{
			{ID: refs[0].ID, ClaimToken: refs[0].ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200},
			{ID: refs[1].ID, ClaimToken: refs[1].ClaimToken, Status: outboxdb.StatusPending, Sent: true, HTTPStatus: 503, Error: "http 503"},
			{ID: refs[2].ID, ClaimToken: refs[2].ClaimToken, Status: outboxdb.StatusFailed, Sent: true, HTTPStatus: 400, Error: "http 400",
				Class: outboxdb.ClassTransient},
		}, outboxdb.RecordOptions{OnFailed: outboxdb.OrderBlock})
		noPermissionError("recording a success, a retry and a failure that blocks its key", err)

		dead, err := outboxdb.ClaimDeadLetters(ctx, svc, 10, time.Minute)
		noPermissionError("claiming dead letters", err)
		if len(dead) != 1 {
			t.Fatalf("claimed %d dead letters, want the FAILED row", len(dead))
		}
		_, err = outboxdb.ReleaseDeadLetters(ctx, svc, []outboxdb.DeadLetterRef{dead[0].DeadLetterRef()}, 0)
		noPermissionError("giving a dead letter back", err)
		dead, err = outboxdb.ClaimDeadLetters(ctx, svc, 10, time.Minute)
		noPermissionError("claiming dead letters again", err)
		_, err = outboxdb.MarkDeadLettered(ctx, svc, []outboxdb.DeadLetterRef{dead[0].DeadLetterRef()})
		noPermissionError("marking a dead letter published", err)
		_, err = outboxdb.ReleaseKey(ctx, svc, outboxdb.ReleaseOptions{Key: orderingKeyOf[claimed[2].MessageKey], Operator: "test"})
		noPermissionError("releasing a blocked key (outbox release in a pod)", err)
		n, err := outboxdb.Compensate(ctx, svc, 3, 0, 100)
		noPermissionError("compensating", err)
		if n != 1 {
			t.Errorf("compensation requeued %d rows, want the FAILED one", n)
		}
		_, _, err = outboxdb.CompensationCounts(ctx, svc, 3)
		noPermissionError("counting compensation", err)
		_, err = outboxdb.RepairOrdering(ctx, svc, 100)
		noPermissionError("repairing ordering", err)

		_, err = outboxdb.SetBreaker(ctx, svc, []string{"CLOSED"}, "OPEN", "svc-1", "test", time.Second)
		noPermissionError("opening the breaker", err)
		_, err = outboxdb.TryProbe(ctx, svc, time.Second)
		noPermissionError("probing", err)
		_, err = outboxdb.PausePlatform(ctx, svc, time.Second)
		noPermissionError("pausing the platform", err)
		_, _, err = outboxdb.TakeRateTokens(ctx, svc, 1, 100, 100)
		noPermissionError("taking rate tokens", err)
		_, err = outboxdb.ReadPlatformState(ctx, svc)
		noPermissionError("reading the platform state", err)

		_, err = outboxdb.ReadRecordGauges(ctx, svc, outboxdb.GaugeOptions{})
		noPermissionError("reading the gauges", err)
		_, err = outboxdb.ReadStats(ctx, svc, outboxdb.StatsOptions{})
		noPermissionError("reading stats", err)
		_, err = outboxdb.Find(ctx, svc, outboxdb.FindFilter{Plate: "P-1"}, outboxdb.LookupOptions{})
		noPermissionError("finding by plate", err)
		_, err = outboxdb.Requeue(ctx, svc, outboxdb.RequeueFilter{Statuses: []outboxdb.Status{outboxdb.StatusSuccess},
			Keys: []string{claimed[0].MessageKey}}, outboxdb.RequeueOptions{Note: "requeued by a test"})
		noPermissionError("requeueing (outbox requeue in a pod)", err)

		_, err = outboxdb.LogOperatorAction(ctx, svc, outboxdb.OperatorAction{Operator: "test", Action: outboxdb.ActionRequeue,
			Filter: "status=FAILED", Rows: 1})
		noPermissionError("recording an operator's action (outbox requeue in a pod)", err)

		// Retention retires finished days through forward_partition_retire.
		noPermissionError("creating past partitions", svc.QueryRow(ctx,
			`SELECT forward_partition_ensure(now() - interval '3 days', now(), interval '1 day')`).Scan(&created))
		purged, err := outboxdb.Purge(ctx, svc, outboxdb.PurgeOptions{Operator: "test"})
		noPermissionError("retiring finished partitions (retention)", err)
		if parts, _, _ := purged.Retired(); parts == 0 {
			t.Errorf("retention retired no partition of the past days: %+v", purged)
		}

		// Drained to the end, every message is delivered.
		for range 20 {
			claimed, err := outboxdb.Claim(ctx, svc, 100, time.Minute, "svc-1")
			noPermissionError("claiming", err)
			if len(claimed) == 0 {
				break
			}
			results := make([]outboxdb.Result, len(claimed))
			for i, r := range claimed {
				results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess, Sent: true, HTTPStatus: 200}
			}
			_, err = outboxdb.RecordResults(ctx, svc, results, outboxdb.RecordOptions{})
			noPermissionError("recording results", err)
		}
		var left int
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM forward_records WHERE message_key LIKE 'role-%' AND status <> 'SUCCESS'`).Scan(&left); err != nil || left != 0 {
			t.Errorf("%d messages not delivered (%v), want none", left, err)
		}
	})

	t.Run("TheReadOnlyConsoleReadsAndChangesNothing", func(t *testing.T) {
		if _, err := outboxdb.ReadStats(ctx, ro, outboxdb.StatsOptions{}); err != nil {
			t.Errorf("stats as the read-only console: %v", err)
		}
		if _, err := outboxdb.ReadRecordGauges(ctx, ro, outboxdb.GaugeOptions{}); err != nil {
			t.Errorf("gauges as the read-only console: %v", err)
		}
		if _, err := outboxdb.Find(ctx, ro, outboxdb.FindFilter{Plate: "P-1"}, outboxdb.LookupOptions{}); err != nil {
			t.Errorf("find as the read-only console: %v", err)
		}
		_, err := outboxdb.Requeue(ctx, ro, outboxdb.RequeueFilter{Statuses: []outboxdb.Status{outboxdb.StatusSuccess}},
			outboxdb.RequeueOptions{Note: "must not happen"})
		if !isPermissionDenied(err) {
			t.Errorf("a requeue as the read-only console: err = %v, want permission denied", err)
		}
		if missing, err := outboxdb.MissingGrants(ctx, ro, outboxdb.ConsoleActionGrants); err != nil || len(missing) == 0 {
			t.Errorf("the read-only console lacks %v (%v) of the actions' grants, want them all missing", missing, err)
		}
	})

	t.Run("TheConsoleWithItsActionsRequeues", func(t *testing.T) {
		n, err := outboxdb.Requeue(ctx, rw, outboxdb.RequeueFilter{Statuses: []outboxdb.Status{outboxdb.StatusSuccess},
			Keys: []string{"role-k-a"}}, outboxdb.RequeueOptions{Note: "requeued by the console"})
		if err != nil || n != 1 {
			t.Fatalf("requeueing a delivered message as the console: %d, %v; want 1", n, err)
		}
		var status string
		if err := owner.QueryRow(ctx, `SELECT status FROM forward_records WHERE message_key = 'role-k-a'`).Scan(&status); err != nil || status != "PENDING" {
			t.Errorf("the requeued message is %s (%v), want PENDING", status, err)
		}
	})

	t.Run("WithoutTheSequenceTheServiceCannotInsertAndSaysSo", func(t *testing.T) {
		// Last: it takes a grant away.
		exec(t, owner, "REVOKE USAGE ON SEQUENCE forward_messages_id_seq FROM "+service)
		_, err := outboxdb.InsertBatchCount(ctx, svc, []outboxdb.NewRecord{pendingRec("role-after-revoke", 99)})
		if !isPermissionDenied(err) {
			t.Errorf("an insert without USAGE on forward_messages_id_seq: err = %v, want permission denied", err)
		}
		missing, err := outboxdb.MissingGrants(ctx, svc, outboxdb.ServiceGrants)
		if err != nil || !slices.Equal(missing, []string{"USAGE on sequence forward_messages_id_seq"}) {
			t.Errorf("MissingGrants = %v (%v), want the sequence named", missing, err)
		}
	})
}

// checkExactPrivileges compares role's privileges on every table, view and
// sequence of the schema and every SECURITY DEFINER function (one runs as
// the owner: calling it is a privilege) with grants: nothing missing,
// nothing more; and no DDL right.
func checkExactPrivileges(t *testing.T, owner *pgxpool.Pool, role string, grants []outboxdb.Grant) {
	t.Helper()
	ctx := context.Background()
	name := strings.Trim(role, `"`)
	pgtest.CheckGrants(t, owner, name, "docs/deployment.md", grants)
	var super, createRole, createDB, createInSchema, createInDB bool
	if err := owner.QueryRow(ctx, `SELECT rolsuper, rolcreaterole, rolcreatedb,
			has_schema_privilege($1, 'public', 'CREATE'), has_database_privilege($1, current_database(), 'CREATE')
		FROM pg_roles WHERE rolname = $1`, name).Scan(&super, &createRole, &createDB, &createInSchema, &createInDB); err != nil {
		t.Fatal(err)
	}
	if super || createRole || createDB || createInSchema || createInDB {
		t.Errorf("%s: superuser %v, createrole %v, createdb %v, create in public %v, create in the database %v; want none",
			name, super, createRole, createDB, createInSchema, createInDB)
	}
}

func isPermissionDenied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
