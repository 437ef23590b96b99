package outboxcli_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxcli"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

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
	app := &cli.App{
		Name:           "forwarder",
		Writer:         w,
		ErrWriter:      w,
		Commands:       []*cli.Command{outboxcli.Command()},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	full := append([]string{"forwarder", "outbox", "--database-url", b.dsn}, args...)
	return app.RunContext(context.Background(), full)
}

func (b *testBundle) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := b.run(t, args...)
	if err != nil {
		t.Fatalf("outbox %v: %v\n%s", args, err, out)
	}
	return out
}

// row describes a forward_records row to insert. Zero values give a fresh
// PENDING row due now.
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
	// logs are appended attempt logs: {result_status, errcode} ("" errcode: NULL).
	logs [][2]string
	// class is the failure class of a FAILED row ("": none).
	class string
}

func (b *testBundle) insert(t *testing.T, rows ...row) map[string]int64 {
	t.Helper()
	ctx := context.Background()
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
		var id int64
		err := b.pool.QueryRow(ctx, `INSERT INTO forward_records
			(message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload, status,
			 attempt_count, next_retry_at, last_error, created_at, updated_at, succeeded_at,
			 claim_token, claimed_by, claimed_at, failure_class, failed_at)
			VALUES ($1, 'VEHICLE_EVENT', 'device-vehicle-event', 0, 0, '\x7b7d', $2::text, $3,
			 CASE $2::text WHEN 'PENDING' THEN now() - $5::bigint * interval '1 ms'
			               WHEN 'IN_PROGRESS' THEN now() + $7::bigint * interval '1 ms' END,
			 nullif($4, ''),
			 now() - $5::bigint * interval '1 ms', now() - $5::bigint * interval '1 ms',
			 CASE WHEN $2::text = 'SUCCESS' THEN now() - $6::bigint * interval '1 ms' END,
			 CASE WHEN $2::text = 'IN_PROGRESS' THEN gen_random_uuid() END,
			 CASE WHEN $2::text = 'IN_PROGRESS' THEN 'holder' END,
			 CASE WHEN $2::text = 'IN_PROGRESS' THEN now() END,
			 nullif($8, ''), CASE WHEN $2::text = 'FAILED' THEN now() - $5::bigint * interval '1 ms' END)
			RETURNING id`,
			r.key, string(status), r.attempts, r.lastErr, r.age.Milliseconds(), delivered.Milliseconds(),
			r.leaseLeft.Milliseconds(), r.class).Scan(&id)
		if err != nil {
			t.Fatalf("inserting %s: %v", r.key, err)
		}
		for i, l := range r.logs {
			if _, err := b.pool.Exec(ctx, `INSERT INTO forward_retry_logs
				(record_id, attempt_number, result_status, platform_errcode)
				VALUES ($1, $2, $3, nullif($4, ''))`, id, i+1, l[0], l[1]); err != nil {
				t.Fatal(err)
			}
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
