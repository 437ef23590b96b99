package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	testToken = "console-test-token-0123456789-abcdef"
	plate     = "粤B12345"
	vehicle   = `{"messageId":"m-1","deviceId":"CAM-0001","parkCode":"P1001","berthCode":"B-012","plateNo":"粤B12345",` +
		`"inoutType":1,"inoutTime":1779330600000,"plateCredible":0.854,"pictures":[]}`
)

func TestCheckAddr(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr, token string
		err         string
	}{
		{"127.0.0.1:4196", "", ""},
		{"localhost:4196", "", ""},
		{"[::1]:4196", "", ""},
		{"0.0.0.0:4196", "", "CONSOLE_ADDR 0.0.0.0:4196 is not a loopback address: set CONSOLE_TOKEN"},
		{":4196", "", "is not a loopback address: set CONSOLE_TOKEN"},
		{"10.1.2.3:4196", "", "set CONSOLE_TOKEN"},
		{"console.example:4196", "", "set CONSOLE_TOKEN"},
		{"0.0.0.0:4196", testToken, ""},
		{"0.0.0.0:4196", "Q", "CONSOLE_TOKEN is 1 character long: use at least 32"},
		{"0.0.0.0:4196", "short", "CONSOLE_TOKEN is 5 characters long: use at least 32"},
		{"0.0.0.0:4196", strings.Repeat("a", 16), "CONSOLE_TOKEN is 16 characters long: use at least 32"},
		{"127.0.0.1:4196", strings.Repeat("a", 31), "CONSOLE_TOKEN is 31 characters long: use at least 32"},
		{"0.0.0.0:4196", strings.Repeat("ab", 20), "CONSOLE_TOKEN uses 2 different characters: use a random token of at least 32 characters"},
		{"0.0.0.0:4196", "0123456789abcdef0123456789abcdef", ""},
		{"4196", "", "want host:port"},
	} {
		err := console.CheckAddr(c.addr, c.token)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("CheckAddr(%q, %q) = %v, want %q", c.addr, c.token, err, c.err)
		}
		if err != nil && c.token != "" && strings.Contains(err.Error(), c.token) {
			t.Errorf("the error shows the token: %v", err)
		}
	}
}

type testBundle struct {
	pool *pgxpool.Pool
	ids  map[string]int64
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{pool: pgtest.NewPool(t), ids: map[string]int64{}}
	db := fixture.New(t, b.pool)
	add := func(key, status, class, lastErr, payload, plate string) {
		id := db.Insert(fixture.Row{Key: key, Status: status, FailureClass: class, LastError: lastErr,
			Payload: []byte(payload), Attempts: 5, PlateNo: plate, ParkCode: "P1001", BerthCode: "B-012",
			DeviceID: "CAM-0001", Offset: 1})[0]
		if status == "FAILED" && class == "" {
			// A row failed before failure classes existed.
			db.Exec(`UPDATE forward_deliveries SET failure_class = NULL WHERE id = $1`, id)
		}
		b.ids[key] = id
		if status == "SUCCESS" {
			// The fixture's SUCCESS attempt says how it was delivered.
			db.Exec(`UPDATE forward_retry_logs SET http_status = 200, platform_errcode = '999',
				error_message = 'http 200: {"result":1,"errcode":"999"}' WHERE record_id = $1`, id)
			return
		}
		db.Exec(`INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status,
			http_status, platform_errcode, error_message)
			SELECT id, created_at, 5, $2, 200, '999', 'http 200: {"result":1,"errcode":"999"}'
			FROM forward_messages WHERE id = $1`, id, status)
	}
	add("m-1", "FAILED", "TRANSIENT", `http 200: {"errcode":"999","message_id":"m-1"}`, vehicle, plate)
	// Two rows of one reason once normalised (long numbers differ).
	add("m-2", "FAILED", "TRANSIENT", `timeout after 10000ms on request 1234567`, `{}`, "")
	add("m-3", "FAILED", "TRANSIENT", `timeout after 10000ms on request 7654321`, `{}`, "")
	add("m-4", "FAILED", "REJECTED", `not retried: errcode 998`, `{}`, "")
	add("m-5", "SUCCESS", "", "", `{}`, "")
	return b
}

type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	auth string
}

func (b *testBundle) start(t *testing.T, cfg console.Config) *client {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Operator == "" {
		cfg.Operator = "local-op"
	}
	cfg.MappingsDir = "../../mappings"
	srv, err := console.New(cfg, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: ts.URL, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (c *client) do(method, path string, form url.Values, header map[string]string) (int, http.Header, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (c *client) get(path string) string {
	c.t.Helper()
	code, _, body := c.do("GET", path, nil, nil)
	if code != http.StatusOK {
		c.t.Fatalf("GET %s: %d\n%s", path, code, body)
	}
	return body
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

func (b *testBundle) status(t *testing.T, key string) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(context.Background(), "SELECT status FROM forward_records WHERE message_key = $1", key).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *testBundle) operatorLog(t *testing.T) []outboxdb.OperatorAction {
	t.Helper()
	as, err := outboxdb.RecentOperatorActions(context.Background(), b.pool, 100)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func TestConsole(t *testing.T) {
	t.Parallel()

	t.Run("TokenRequired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{Token: testToken})
		for _, p := range []string{"/", "/search?plate=" + url.QueryEscape(plate), fmt.Sprintf("/records/%d", b.ids["m-1"]), "/failed"} {
			code, h, body := c.do("GET", p, nil, nil)
			if code != http.StatusUnauthorized || strings.Contains(body, plate) || !strings.Contains(h.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("GET %s without the token: %d %q", p, code, body)
			}
			code, h, _ = c.do("GET", p, nil, map[string]string{"Accept": "text/html"})
			if code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/login?next=") {
				t.Errorf("a browser without the token: %d to %q, want the login form", code, h.Get("Location"))
			}
			if code, _, _ = c.do("GET", p, nil, map[string]string{"Authorization": "Bearer wrong-token-wrong-token"}); code != http.StatusUnauthorized {
				t.Errorf("GET %s with a wrong token: %d", p, code)
			}
		}
		code, _, _ := c.do("POST", fmt.Sprintf("/records/%d/requeue", b.ids["m-1"]), url.Values{}, nil)
		if code != http.StatusUnauthorized || b.status(t, "m-1") != "FAILED" {
			t.Errorf("a requeue without the token: %d, row %s", code, b.status(t, "m-1"))
		}

		c.auth = "Bearer " + testToken
		if body := c.get("/search?plate=" + url.QueryEscape(plate)); !strings.Contains(body, plate) {
			t.Errorf("the bearer token does not open the search:\n%s", body)
		}
		c.auth = "Basic " + basic("erin", testToken)
		if body := c.get("/"); !strings.Contains(body, `operator <b id="operator">erin</b>`) {
			t.Errorf("basic auth: the operator is not the user name:\n%s", body)
		}
	})

	t.Run("LoginRequeueAndAudit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{Token: testToken})
		code, _, body := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {"nope"}, "next": {"/search"}}, nil)
		if code != http.StatusUnauthorized || !strings.Contains(body, "Wrong token.") {
			t.Fatalf("login with a wrong token: %d", code)
		}
		code, h, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {testToken}, "next": {"//evil.example/"}}, nil)
		if code != http.StatusSeeOther || h.Get("Location") != "/" {
			t.Fatalf("login: %d to %q, want / (never another site)", code, h.Get("Location"))
		}
		if sc := h.Get("Set-Cookie"); !strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "SameSite=Strict") || strings.Contains(sc, testToken) {
			t.Errorf("session cookie %q", sc)
		}

		overview := c.get("/")
		for _, want := range []string{`operator <b id="operator">alice</b>`, "Rows by status", "Breaker", "CLOSED", "FAILED rows by class"} {
			if !strings.Contains(overview, want) {
				t.Errorf("the overview lacks %q", want)
			}
		}
		search := c.get("/search?plate=" + url.QueryEscape(plate))
		if !strings.Contains(search, fmt.Sprintf(`href="/records/%d"`, b.ids["m-1"])) || !strings.Contains(search, ">1 row for ") {
			t.Fatalf("the search does not list m-1, as 1 row:\n%s", search)
		}
		if !strings.Contains(overview, "0 rows held behind an earlier row of their key; 0 keys blocked") {
			t.Errorf("the overview's ordering line:\n%s", overview)
		}
		record := c.get(fmt.Sprintf("/records/%d", b.ids["m-1"]))
		for _, want := range []string{`&#34;plateNo&#34;: &#34;粤B12345&#34;`, `&#34;access_pwd&#34;: &#34;***&#34;`,
			`&#34;credibility&#34;: &#34;85&#34;`, `id="attempts"`, `href="/records/` + fmt.Sprint(b.ids["m-1"]) + `/requeue"`} {
			if !strings.Contains(record, want) {
				t.Errorf("the record page lacks %s", want)
			}
		}

		confirm := c.get(fmt.Sprintf("/records/%d/requeue", b.ids["m-1"]))
		if !strings.Contains(confirm, "Requeue 1 row") || b.status(t, "m-1") != "FAILED" {
			t.Fatalf("the confirmation changed something or says nothing:\n%s", confirm)
		}
		path := fmt.Sprintf("/records/%d/requeue", b.ids["m-1"])
		if code, _, _ := c.do("POST", path, url.Values{}, nil); code != http.StatusForbidden || b.status(t, "m-1") != "FAILED" {
			t.Fatalf("a POST without the CSRF token: %d", code)
		}
		if code, _, _ := c.do("POST", path, url.Values{"csrf": {csrfOf(t, confirm)}}, map[string]string{"Origin": "http://evil.example"}); code != http.StatusForbidden {
			t.Fatalf("a POST from another origin: %d", code)
		}
		code, h, _ = c.do("POST", path, url.Values{"csrf": {csrfOf(t, confirm)}}, nil)
		if code != http.StatusSeeOther || b.status(t, "m-1") != "PENDING" {
			t.Fatalf("requeue: %d, row %s", code, b.status(t, "m-1"))
		}
		if after := c.get(h.Get("Location")); !strings.Contains(after, "Requeued: the row is PENDING") || !strings.Contains(after, `id="status">PENDING`) {
			t.Errorf("the page after the requeue:\n%s", after)
		}
		log := b.operatorLog(t)
		if len(log) != 1 || log[0].Operator != "alice" || log[0].Rows != 1 || log[0].Filter != fmt.Sprintf(`console: row %d key="m-1"`, b.ids["m-1"]) {
			t.Errorf("operator log %+v", log)
		}
		var note string
		if err := b.pool.QueryRow(context.Background(), `SELECT error_message FROM forward_retry_logs
			WHERE record_id = $1 AND result_status = 'REQUEUED'`, b.ids["m-1"]).Scan(&note); err != nil || !strings.HasPrefix(note, "requeued by alice (console)") {
			t.Errorf("REQUEUED attempt log %q, %v", note, err)
		}
	})

	t.Run("RequeueAGroup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{Operator: "frank"})
		failed := c.get("/failed")
		const reason = "timeout after <n>ms on request <n>"
		if !strings.Contains(failed, `<td>2</td><td>TRANSIENT</td><td class="reason">timeout after &lt;n&gt;ms on request &lt;n&gt;</td>`) {
			t.Fatalf("no group of 2 rows for %q:\n%s", reason, failed)
		}
		q := "/failed/requeue?class=TRANSIENT&reason=" + url.QueryEscape(reason)
		confirm := c.get(q)
		if !strings.Contains(confirm, `<td id="group-rows">2</td>`) {
			t.Fatalf("confirmation:\n%s", confirm)
		}
		code, h, _ := c.do("POST", "/failed/requeue", url.Values{"csrf": {csrfOf(t, confirm)}, "class": {"TRANSIENT"}, "reason": {reason}}, nil)
		if code != http.StatusSeeOther || !strings.Contains(h.Get("Location"), url.QueryEscape("Requeued 2 rows")) {
			t.Fatalf("group requeue: %d %q", code, h.Get("Location"))
		}
		for key, want := range map[string]string{"m-1": "FAILED", "m-2": "PENDING", "m-3": "PENDING", "m-4": "FAILED"} {
			if got := b.status(t, key); got != want {
				t.Errorf("%s is %s, want %s", key, got, want)
			}
		}
		if log := b.operatorLog(t); len(log) != 1 || log[0].Operator != "frank" || log[0].Rows != 2 {
			t.Errorf("operator log %+v", log)
		}
	})

	t.Run("GroupsAndRequeueCountsAgree", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		groups, err := outboxdb.FailedGroups(ctx, b.pool, 100)
		if err != nil || len(groups) != 3 {
			t.Fatalf("%d groups, %v; want 3", len(groups), err)
		}
		for _, g := range groups {
			f := outboxdb.RequeueFilter{Reason: &g.Reason, Classes: []outboxdb.FailureClass{outboxdb.FailureClass(g.Class)}}
			c, err := outboxdb.CountRequeue(ctx, b.pool, f)
			if err != nil || c.Rows != g.Rows {
				t.Errorf("group %+v: requeue would take %d rows (%v)", g, c.Rows, err)
			}
		}
	})

	t.Run("AHeldRowLinksTheRowItWaitsBehind", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db := fixture.New(t, b.pool)
		head := db.Insert(fixture.Row{Key: "enter-<b>", Attempts: 3, LastError: "http 500: <script>", OrderingKey: "P1001/B-012"})[0]
		held := db.Insert(fixture.Row{Key: "exit", OrderingKey: "P1001/B-012", OrderHeld: true})[0]
		c := b.start(t, console.Config{})
		record := c.get(fmt.Sprintf("/records/%d", held))
		for _, want := range []string{fmt.Sprintf(`<a href="/records/%d">row %d</a>`, head, head), `<code>enter-&lt;b&gt;</code>: PENDING, 3 attempts, next attempt`,
			`<span class="reason">http 500: &lt;script&gt;</span>`} {
			if !strings.Contains(record, want) {
				t.Errorf("the held row's page lacks %s", want)
			}
		}
		if page := c.get(fmt.Sprintf("/records/%d", head)); strings.Contains(page, `id="held-behind"`) {
			t.Errorf("the head's page says it is held")
		}
		if strings.Contains(record, `id="platform-stopped"`) {
			t.Errorf("with the breaker closed, the page says the row is not sent for now")
		}
		if ok, err := outboxdb.SetBreaker(context.Background(), b.pool, []string{"CLOSED"}, "OPEN", "test", "http 503", time.Second); err != nil || !ok {
			t.Fatalf("opening the breaker: %v, %v", ok, err)
		}
		if page := c.get(fmt.Sprintf("/records/%d", held)); !strings.Contains(page, `id="platform-stopped"`) ||
			!strings.Contains(page, "circuit breaker is OPEN since") {
			t.Errorf("with the breaker open, the unfinished row's page does not say it waits:\n%s", page)
		}
		if page := c.get(fmt.Sprintf("/records/%d", b.ids["m-1"])); strings.Contains(page, `id="platform-stopped"`) {
			t.Errorf("a FAILED row's page says it waits for the platform")
		}
	})

	t.Run("ReadOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{ReadOnly: true})
		record := c.get(fmt.Sprintf("/records/%d", b.ids["m-1"]))
		if strings.Contains(record, "/requeue") || !strings.Contains(record, "read-only") {
			t.Errorf("a read-only record page offers the action:\n%s", record)
		}
		if strings.Contains(c.get("/failed"), "requeue…") {
			t.Error("a read-only failed page offers the action")
		}
		if code, _, _ := c.do("GET", fmt.Sprintf("/records/%d/requeue", b.ids["m-1"]), nil, nil); code != http.StatusForbidden {
			t.Errorf("read-only confirmation page: %d", code)
		}
		code, _, _ := c.do("POST", fmt.Sprintf("/records/%d/requeue", b.ids["m-1"]), url.Values{}, nil)
		if code != http.StatusForbidden || b.status(t, "m-1") != "FAILED" {
			t.Errorf("read-only POST: %d, row %s", code, b.status(t, "m-1"))
		}
	})

	t.Run("OpenOnLoopbackOnlyByAddress", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{})
		if body := c.get("/"); !strings.Contains(body, "open (loopback, no token)") || !strings.Contains(body, "local-op") {
			t.Errorf("an open console does not say so:\n%s", body)
		}
		code, _, _ := c.do("GET", "/", nil, map[string]string{"Host": "rebound.example:4196"})
		if code != http.StatusMisdirectedRequest {
			t.Errorf("a request for another host name: %d, want 421", code)
		}
		_, h, _ := c.do("GET", "/", nil, nil)
		if !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") || h.Get("Cache-Control") != "no-store" {
			t.Errorf("headers %v", h)
		}
	})

	// paused_until keeps the end of the last Retry-After pause ('epoch'
	// when there never was one): the overview shows a pause only while one
	// is in force, on the database clock.
	t.Run("PauseShownOnlyWhileInForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{})
		setPause := func(sql string) {
			t.Helper()
			if _, err := b.pool.Exec(context.Background(), "UPDATE forward_platform_state SET paused_until = "+sql); err != nil {
				t.Fatal(err)
			}
		}
		if body := strings.ToLower(c.get("/")); strings.Contains(body, "sending paused") || strings.Contains(body, "1970") {
			t.Errorf("never paused ('epoch'), yet the overview says:\n%s", body)
		}
		setPause("now() - interval '1 minute'")
		if body := strings.ToLower(c.get("/")); strings.Contains(body, "sending paused") {
			t.Errorf("a pause that ended a minute ago is shown:\n%s", body)
		}
		setPause("now() + interval '10 minutes'")
		var until time.Time
		if err := b.pool.QueryRow(context.Background(), "SELECT paused_until FROM forward_platform_state").Scan(&until); err != nil {
			t.Fatal(err)
		}
		want := `id="paused">Sending paused (Retry-After) until ` + until.UTC().Format("2006-01-02 15:04:05Z")
		if body := c.get("/"); !strings.Contains(body, want) {
			t.Errorf("a pause in force for 10 more minutes is not shown (want %q):\n%s", want, body)
		}
	})

	// Pointed at a standby, the console shows what it reads, and an action
	// says the database takes no writes rather than quoting PostgreSQL.
	t.Run("ReadOnlyDatabase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pgtest.SetReadOnly(t, b.pool, true)
		c := b.start(t, console.Config{})
		overview := c.get("/")
		code, _, body := c.do("POST", "/delivery/pause", url.Values{"csrf": {csrfOf(t, overview)}, "until": {"1h"}}, nil)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "The database accepts no writes") || !strings.Contains(body, "target_session_attrs=read-write") {
			t.Errorf("pause on a read-only database: %d, want 503 saying the database takes no writes:\n%s", code, body)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{})
		// A NUL byte or bytes that are not UTF-8 in a filter were sent to
		// PostgreSQL, which refused them: a 500 and an ERROR in the log.
		for path, want := range map[string]int{"/records/999999": 404, "/records/abc": 404, "/search?status=DONE": 200,
			"/search?since=yesterday": 200, "/nope": 404, "/failed/requeue?class=WHATEVER": 400,
			"/search?plate=%00": 200, "/search?berth=a%ffb&park=P1": 200, "/failed/requeue?class=TRANSIENT&reason=%00": 400} {
			if code, _, _ := c.do("GET", path, nil, nil); code != want {
				t.Errorf("GET %s: %d, want %d", path, code, want)
			}
		}
		if body := c.get("/search?since=yesterday"); !strings.Contains(body, "since: ") {
			t.Errorf("a bad since is not explained:\n%s", body)
		}
		if _, _, body := c.do("GET", "/records/99999999999999999999", nil, nil); !strings.Contains(body, "no row with id 99999999999999999999") {
			t.Errorf("an id past int64 is not a row that does not exist:\n%s", body)
		}
		if body := c.get("/search?plate=%00"); !strings.Contains(body, `plate &#34;\x00&#34;: not text (a NUL byte, or bytes that are not UTF-8)`) {
			t.Errorf("a plate with a NUL byte is not explained:\n%s", body)
		}
		// A limit out of range is refused as the find command refuses it,
		// 0 included (it used to be read as the default, 50).
		for _, limit := range []string{"0", "-1", "1001", "ten"} {
			body := c.get("/search?park=P1001&limit=" + limit)
			if want := fmt.Sprintf("limit &#34;%s&#34;: want 1 to 1000", limit); !strings.Contains(body, want) || strings.Contains(body, "m-1") {
				t.Errorf("limit=%s: the page does not say %q (or lists rows):\n%s", limit, want, body)
			}
		}
		if _, _, body := c.do("GET", "/failed/requeue?class=WHATEVER", nil, nil); !strings.Contains(body, "unknown failure class &#34;WHATEVER&#34;: want TRANSIENT, REJECTED or INVALID") {
			t.Errorf("an unknown class is not explained:\n%s", body)
		}
		// The confirmation's form posts the reason quoted: once unquoted it
		// is checked as the link's is, before anything is requeued or
		// recorded.
		csrf := csrfOf(t, c.get("/"))
		for reasonQ, want := range map[string]string{strconv.Quote("a\x00b"): `reason &#34;a\x00b&#34;: not text`, `"open`: "reason_q is not a quoted string"} {
			form := url.Values{"csrf": {csrf}, "class": {"TRANSIENT"}, "reason": {"boom"}, "reason_q": {reasonQ}}
			if code, _, body := c.do("POST", "/failed/requeue", form, nil); code != http.StatusBadRequest || !strings.Contains(body, want) {
				t.Errorf("POST reason_q=%s: %d, want 400 saying %q:\n%s", reasonQ, code, want, body)
			}
		}
		var actions int
		if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM forward_operator_log").Scan(&actions); err != nil || actions != 0 {
			t.Errorf("refused requeues recorded %d actions (%v), want none", actions, err)
		}
	})
}

func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := console.New(console.Config{Addr: "127.0.0.1:0", Operator: "x"}, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, func(a string) { addr <- a }) }()
	resp, err := http.Get("http://" + <-addr + "/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil after a graceful stop", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func basic(user, pass string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(user, pass)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}
