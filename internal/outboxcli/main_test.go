package outboxcli_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxcli"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The tests wait on PostgreSQL far more than they use the CPU: eight run at
// once, where GOMAXPROCS (two on the CI machine) leaves the cores idle while
// two tests wait.
func TestMain(m *testing.M) { pgtest.MainParallel(m, 8) }

// testBundle is a fresh migrated database and a way to run the command on it.
type testBundle struct {
	dsn  string
	pool *pgxpool.Pool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	return &testBundle{dsn: dsn, pool: pool}
}

// run runs `forwarder outbox <args>` and returns its output and error; exit
// errors are returned instead of exiting the test binary.
func (b *testBundle) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := b.runTo(t, &out, args...)
	return out.String(), err
}

// runTo is run writing the output to w.
func (b *testBundle) runTo(t *testing.T, w io.Writer, args ...string) error {
	t.Helper()
	return b.runCtx(context.Background(), t, w, args...)
}

// runCtx is runTo until ctx ends (a command that runs until interrupted).
func (b *testBundle) runCtx(ctx context.Context, t *testing.T, w io.Writer, args ...string) error {
	t.Helper()
	app := &cli.App{
		Name:           "forwarder",
		Writer:         w,
		ErrWriter:      w,
		Commands:       []*cli.Command{outboxcli.Command()},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	full := append([]string{"forwarder", "outbox", "--database-url", b.dsn}, args...)
	return app.RunContext(ctx, full)
}

func (b *testBundle) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := b.run(t, args...)
	if err != nil {
		t.Fatalf("outbox %v: %v\n%s", args, err, out)
	}
	return out
}

// row describes an outbox row to insert (through the fixture). Zero values
// give a fresh PENDING row due now.
type row struct {
	key      string
	status   outboxdb.Status
	attempts int
	lastErr  string
	// age moves created_at, updated_at and succeeded_at into the past.
	age time.Duration
	// deliveredAgo overrides succeeded_at's age for SUCCESS rows.
	deliveredAgo *time.Duration
	// leaseLeft is the lease remaining for IN_PROGRESS rows (negative: expired).
	leaseLeft time.Duration
	// logs are appended attempt logs: {result_status, errcode} ("" errcode:
	// NULL). A SUCCESS row says how it was delivered in its last SUCCESS
	// log: when logs has none, the fixture's is kept.
	logs [][2]string
	// class is the failure class of a FAILED row ("": none).
	class string
}

func (b *testBundle) insert(t *testing.T, rows ...row) map[string]int64 {
	t.Helper()
	db := fixture.New(t, b.pool)
	ids := map[string]int64{}
	for _, r := range rows {
		status := r.status
		if status == "" {
			status = outboxdb.StatusPending
		}
		delivered := r.age
		if r.deliveredAgo != nil {
			delivered = *r.deliveredAgo
		}
		var due *time.Duration
		switch status {
		case outboxdb.StatusPending:
			due = ptr(-r.age)
		case outboxdb.StatusInProgress:
			due = ptr(r.leaseLeft)
		}
		id := db.Insert(fixture.Row{Key: r.key, Status: string(status), Payload: []byte("{}"),
			Attempts: r.attempts, DueIn: due, Age: r.age, ClaimedBy: "holder", LastError: r.lastErr,
			FailureClass: r.class})[0]
		ownSuccess := slices.ContainsFunc(r.logs, func(l [2]string) bool { return l[0] == string(outboxdb.StatusSuccess) })
		if status == outboxdb.StatusSuccess && ownSuccess {
			db.Exec(`DELETE FROM forward_retry_logs WHERE record_id = $1`, id)
		}
		for i, l := range r.logs {
			db.Exec(`INSERT INTO forward_retry_logs
				(record_id, record_created_at, attempt_number, result_status, platform_errcode)
				SELECT id, created_at, $2, $3, nullif($4, '') FROM forward_messages WHERE id = $1`,
				id, i+1, l[0], l[1])
		}
		if status == outboxdb.StatusSuccess {
			db.Exec(`UPDATE forward_retry_logs SET attempted_at = now() - $2::bigint * interval '1 ms'
				WHERE record_id = $1 AND result_status = 'SUCCESS'`, id, delivered.Milliseconds())
		}
		if status == outboxdb.StatusFailed && r.class == "" {
			// A row failed before failure classes existed.
			db.Exec(`UPDATE forward_deliveries SET failure_class = NULL WHERE id = $1`, id)
		}
		ids[r.key] = id
	}
	return ids
}

// state is what a test checks of a row after a command.
type state struct {
	Status       string
	AttemptCount int
	Due          bool
	Claimed      bool
	Logs         int
	Requeues     int
}

func (b *testBundle) state(t *testing.T, key string) (state, bool) {
	t.Helper()
	var s state
	err := b.pool.QueryRow(context.Background(), `SELECT r.status, r.attempt_count,
			coalesce(r.next_retry_at <= now(), false), r.claim_token IS NOT NULL,
			(SELECT count(*) FROM forward_retry_logs l WHERE l.record_id = r.id),
			(SELECT count(*) FROM forward_retry_logs l WHERE l.record_id = r.id AND l.result_status = 'REQUEUED')
		FROM forward_records r WHERE r.message_key = $1`, key).
		Scan(&s.Status, &s.AttemptCount, &s.Due, &s.Claimed, &s.Logs, &s.Requeues)
	if err != nil {
		return s, false
	}
	return s, true
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ptr[T any](v T) *T { return &v }

// lastLine is the last line of a command's output: its result, after what
// it printed about what it was going to do.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return lines[len(lines)-1]
}

// operatorLog is forward_operator_log, oldest first.
func (b *testBundle) operatorLog(t *testing.T) []outboxdb.OperatorAction {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT id, at, operator, action, filter, rows FROM forward_operator_log ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	as, err := pgx.CollectRows(rows, pgx.RowToStructByName[outboxdb.OperatorAction])
	if err != nil {
		t.Fatal(err)
	}
	return as
}
