package httpforwarder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// Credentials that need JSON escaping and that no other test text contains.
const (
	testAccessName = `acc-N4ME-"q"-7f3e`
	testAccessPwd  = `pwd-S3CRET-<9b2e>`
)

// platform is an httptest parking platform that records what it receives.
type platform struct {
	srv *httptest.Server

	mu       sync.Mutex
	handler  func(w http.ResponseWriter, r *http.Request, body []byte)
	requests []platformRequest
}

type platformRequest struct {
	path   string
	header http.Header
	body   []byte
}

func newPlatform(t testing.TB, handler func(w http.ResponseWriter, r *http.Request, body []byte)) *platform {
	t.Helper()
	p := &platform{handler: handler}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.requests = append(p.requests, platformRequest{path: r.URL.Path, header: r.Header.Clone(), body: body})
		h := p.handler
		p.mu.Unlock()
		h(w, r, body)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *platform) received() []platformRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]platformRequest(nil), p.requests...)
}

// reply answers every request with status and body.
func reply(status int, body string, headers ...string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// testBundle is one output against a fresh database and a test platform.
type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	dsn      string
	platform *platform
	out      *httpForwarder
	logs     *logbuf.Buffer
}

type setupOpts struct {
	handler func(http.ResponseWriter, *http.Request, []byte)
	// url replaces the platform's base URL (for example a closed port).
	url string
	// extra YAML appended to the output config; it may override defaults.
	extra string
}

// baseYAML is the output config the tests start from: short delays, three
// attempts, the contract's URL routing.
func baseYAML(dsn, baseURL, extra string) string {
	return fmt.Sprintf(`
dsn: %q
url: '%s${! if meta("api_type") == "HEARTBEAT" { "/mch/heartbeat" } else { "/mch/business" } }'
access_name: %q
access_pwd: %q
%s
`, dsn, baseURL, testAccessName, testAccessPwd, withDefaults(extra))
}

// withDefaults adds the test defaults for the keys extra does not set.
func withDefaults(extra string) string {
	defaults := map[string]string{
		"timeout:":       "timeout: 2s",
		"max_in_flight:": "max_in_flight: 8",
		"retry:":         "retry:\n  initial: 1s\n  max: 10s\n  max_attempts: 3",
	}
	out := extra
	for k, v := range defaults {
		if !strings.Contains(extra, "\n"+k) && !strings.HasPrefix(extra, k) {
			out += "\n" + v
		}
	}
	return out
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), dsn: pgtest.NewDB(t), logs: &logbuf.Buffer{}}
	pool, err := outboxdb.Open(b.ctx, b.dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b.pool = pool
	if o.handler == nil {
		o.handler = reply(200, `{"result":0}`)
	}
	b.platform = newPlatform(t, o.handler)
	base := b.platform.srv.URL
	if o.url != "" {
		base = o.url
	}
	b.out = newTestOutput(t, baseYAML(b.dsn, base, o.extra), b.logs)
	if err := b.out.Connect(b.ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestOutput(t testing.TB, yaml string, logs io.Writer) *httpForwarder {
	t.Helper()
	conf, err := httpForwarderSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	var res *service.Resources
	if logs != nil {
		l := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		res = service.MockResources(service.MockResourcesOptUseLogger(service.NewLoggerFromSlog(l)))
	} else {
		res = service.MockResources()
	}
	out, err := newHTTPForwarderFromParsed(conf, res)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = out.Close(context.Background()) })
	return out
}

// claim inserts n due rows of apiType and claims them as outbox_retry would.
func (b *testBundle) claim(t testing.TB, n int, apiType string) []outboxdb.Record {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, insertDueSQL, apiType, n); err != nil {
		t.Fatal(err)
	}
	return b.claimDue(t, n)
}

// insertDueSQL inserts $2 messages of API type $1, each PENDING and due
// now: the message and its delivery state.
const insertDueSQL = `WITH m AS (
	INSERT INTO forward_messages (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
	SELECT gen_random_uuid()::text, $1, 'device-vehicle-event', 0, g, '{}'
	FROM generate_series(1, $2::integer) g
	RETURNING id, created_at, message_key, octet_length(payload) AS size
	)
	INSERT INTO forward_deliveries (id, created_at, message_key, status, next_retry_at, payload_size)
	SELECT id, created_at, message_key, 'PENDING', now(), size FROM m`

// claimDue claims up to n due rows.
func (b *testBundle) claimDue(t testing.TB, n int) []outboxdb.Record {
	t.Helper()
	rows, err := outboxdb.Claim(b.ctx, b.pool, n, time.Minute, "test")
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// makeDue moves a PENDING row's retry time to now.
func (b *testBundle) makeDue(t testing.TB, id int64) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE forward_deliveries SET next_retry_at = now() WHERE id = $1 AND status = 'PENDING'`, id); err != nil {
		t.Fatal(err)
	}
}

// message is what outbox_retry plus the mapping would hand the output.
func message(r outboxdb.Record, body string) *service.Message {
	msg := service.NewMessage([]byte(body))
	msgmeta.SetClaim(msg, msgmeta.ClaimOf(r))
	return msg
}

func mappedBody(r outboxdb.Record) string {
	return fmt.Sprintf(`{"message_id":%q,"device_id":"CAM-0001","park_code":"P1001"}`, r.MessageKey)
}

// rowState is a forward_records row and its attempt log.
type rowState struct {
	Status       string
	AttemptCount int
	HTTPStatus   *int
	LastError    *string
	Due          *time.Duration // next_retry_at - now()
	Succeeded    bool
	ClaimToken   string
	Logs         []logRow
}

type logRow struct {
	Attempt    int
	Status     string
	HTTPStatus *int
	Errcode    *string
	Error      *string
	DurationMs *int
	RetryIn    *time.Duration // next_retry_at - attempted_at: the delay chosen
}

func (b *testBundle) row(t testing.TB, id int64) rowState {
	t.Helper()
	var (
		r   rowState
		due *float64
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT status, attempt_count, last_http_status, last_error,
			extract(epoch FROM next_retry_at - now())::float8, succeeded_at IS NOT NULL,
			coalesce(claim_token::text, '')
		FROM forward_records WHERE id = $1`, id).
		Scan(&r.Status, &r.AttemptCount, &r.HTTPStatus, &r.LastError, &due, &r.Succeeded, &r.ClaimToken); err != nil {
		t.Fatal(err)
	}
	r.Due = seconds(due)
	rows, err := b.pool.Query(b.ctx, `SELECT attempt_number, result_status, http_status, platform_errcode,
			error_message, duration_ms, extract(epoch FROM next_retry_at - attempted_at)::float8
		FROM forward_retry_logs WHERE record_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			l     logRow
			retry *float64
		)
		if err := rows.Scan(&l.Attempt, &l.Status, &l.HTTPStatus, &l.Errcode, &l.Error, &l.DurationMs, &retry); err != nil {
			t.Fatal(err)
		}
		l.RetryIn = seconds(retry)
		r.Logs = append(r.Logs, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

func seconds(f *float64) *time.Duration {
	if f == nil {
		return nil
	}
	d := time.Duration(*f * float64(time.Second))
	return &d
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func num(p *int) string {
	if p == nil {
		return "<nil>"
	}
	return strconv.Itoa(*p)
}
