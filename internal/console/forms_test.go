package console_test

import (
	"context"
	"fmt"
	"html"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
	"github.com/forwarder/forwarder/internal/testsupport/logbuf"
)

var (
	groupLinkRe = regexp.MustCompile(`href="(/failed/requeue\?[^"]*)"`)
	hiddenRe    = regexp.MustCompile(`(?s)<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// browserForm is the form posted to action on page as a browser posts it:
// each hidden field's value unescaped, its line breaks read as the HTML
// parser reads them (CR LF and CR become LF), then written as a form's
// encoding writes them (every LF as CR LF).
func browserForm(t *testing.T, page, action string) url.Values {
	t.Helper()
	_, form, ok := strings.Cut(page, `action="`+action+`"`)
	if !ok {
		t.Fatalf("no form posting to %s:\n%s", action, page)
	}
	form, _, _ = strings.Cut(form, "</form>")
	v := url.Values{}
	for _, m := range hiddenRe.FindAllStringSubmatch(form, -1) {
		val := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(html.UnescapeString(m[2]))
		v.Add(m[1], strings.ReplaceAll(val, "\n", "\r\n"))
	}
	return v
}

// TestRequeueAGroupOfSeveralLines: a group whose reason has a line break
// (a platform's reply of several lines: an error page, indented JSON) is
// requeued through the Failed page's link and the confirmation's form as a
// browser posts it. The form used to carry the reason as it is, which a
// browser posts with CR LF: the confirmation said 2 rows, the requeue
// took none.
func TestRequeueAGroupOfSeveralLines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := fixture.New(t, b.pool)
	const reply = "http 502: <html>\n<head><title>502 Bad Gateway</title></head>\n</html>"
	for _, key := range []string{"nl-1", "nl-2"} {
		db.Insert(fixture.Row{Key: key, Status: "FAILED", FailureClass: "TRANSIENT", LastError: reply})
	}
	c := b.start(t, console.Config{Operator: "frank"})
	link := ""
	for _, m := range groupLinkRe.FindAllStringSubmatch(c.get("/failed"), -1) {
		if strings.Contains(m[1], "502") {
			link = html.UnescapeString(m[1])
		}
	}
	if link == "" {
		t.Fatal("the Failed page has no requeue link for the 502 group")
	}
	confirm := c.get(link)
	if !strings.Contains(confirm, `<td id="group-rows">2</td>`) {
		t.Fatalf("the confirmation does not count 2 rows:\n%s", confirm)
	}
	code, h, _ := c.do("POST", "/failed/requeue", browserForm(t, confirm, "/failed/requeue"), nil)
	if code != http.StatusSeeOther || !strings.Contains(h.Get("Location"), url.QueryEscape("Requeued 2 rows")) {
		t.Errorf("group requeue: %d %q", code, h.Get("Location"))
	}
	for _, key := range []string{"nl-1", "nl-2"} {
		if got := b.status(t, key); got != "PENDING" {
			t.Errorf("%s is %s, want PENDING", key, got)
		}
	}
}

// TestFlashOnlyFromAnAction: the message at the top of a page says what an
// action of this console did; a link made elsewhere cannot put its own
// words there, on the login page or any other.
func TestFlashOnlyFromAnAction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const spoof = "The token changed: log in at http://evil.example/"
	for _, cfg := range []console.Config{{}, {Token: testToken}} {
		c := b.start(t, cfg)
		paths := []string{"/login?done=" + url.QueryEscape(spoof), "/login?done=" + url.QueryEscape(spoof) + "&sig=00"}
		if cfg.Token == "" {
			paths = []string{"/?done=" + url.QueryEscape(spoof), "/failed?done=" + url.QueryEscape(spoof) + "&sig=00"}
		}
		for _, p := range paths {
			if page := c.get(p); strings.Contains(page, "evil.example") {
				t.Errorf("GET %s shows the link's message:\n%s", p, page)
			}
		}
	}
	// An action's own message is shown.
	c := b.start(t, console.Config{})
	overview := c.get("/")
	code, h, _ := c.do("POST", "/delivery/resume", url.Values{"csrf": {csrfOf(t, overview)}}, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("resume: %d", code)
	}
	if page := c.get(h.Get("Location")); !strings.Contains(page, `id="flash">Nothing to resume`) {
		t.Errorf("the page after resume lacks its message:\n%s", page)
	}
}

// TestAFormTooLargeIsRefusedAsSuch: a form over the 64 KiB a form may be
// answers 413 and changes nothing; it used to be read as a stale form
// (403, "reload the page"), which reloading never mended.
func TestAFormTooLargeIsRefusedAsSuch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.start(t, console.Config{Operator: "gina"})
	form := browserForm(t, c.get("/failed/requeue?class=TRANSIENT&reason="+url.QueryEscape(`http 200: {"errcode":"999","message_id":"m-1"}`)), "/failed/requeue")
	form.Set("reason", strings.Repeat("x", 70<<10))
	code, _, body := c.do("POST", "/failed/requeue", form, nil)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "at most 65536 bytes") {
		t.Errorf("a 70 KiB form: %d %q, want 413 saying the limit", code, body)
	}
	if n := fixture.New(t, b.pool).Count(`status = 'FAILED'`); n != 4 {
		t.Errorf("FAILED rows after a refused form: %d, want 4", n)
	}
}

// TestAGroupRequeueCutShortSaysWhatItDid: a requeue commits batch by
// batch; when the request's time runs out after a batch, the page the
// operator lands on says how many rows were requeued and that the rest are
// still FAILED. It used to answer a bare error, as if nothing had been done.
func TestAGroupRequeueCutShortSaysWhatItDid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := fixture.New(t, b.pool)
	ids := db.InsertDue("cut", outboxdb.DefaultAdminBatchSize+1)
	db.Exec(`UPDATE forward_deliveries SET status = 'FAILED', next_retry_at = NULL, failure_class = 'TRANSIENT',
		last_error = 'boom', failed_at = now() WHERE message_key LIKE 'cut-%'`)
	// The second batch waits for this lock until the request's time is up.
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM forward_deliveries WHERE id = $1 FOR UPDATE`, ids[len(ids)-1]); err != nil {
		t.Fatal(err)
	}
	// 2 s a statement, 6 s the request: the first batch has room on a
	// loaded machine.
	c := b.start(t, console.Config{Operator: "hana", StatementTimeout: 2 * time.Second})
	form := browserForm(t, c.get("/failed/requeue?class=TRANSIENT&reason=boom"), "/failed/requeue")
	code, h, body := c.do("POST", "/failed/requeue", form, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("the cut-short requeue: %d, want 303 to the Failed page\n%s", code, body)
	}
	want := fmt.Sprintf("Requeued %d rows", outboxdb.DefaultAdminBatchSize)
	if page := c.get(h.Get("Location")); !strings.Contains(page, want) || !strings.Contains(page, "then stopped: The database took longer") ||
		!strings.Contains(page, "still FAILED: requeue it again") {
		t.Errorf("the Failed page after a cut-short requeue does not say %q, why it stopped and what is left:\n%s", want, page)
	}
	if n := db.Count(`status = 'PENDING' AND message_key LIKE 'cut-%'`); n != outboxdb.DefaultAdminBatchSize {
		t.Errorf("requeued rows: %d, want %d", n, outboxdb.DefaultAdminBatchSize)
	}
}

// TestErrorPagesKeepTheDriversWordsInTheLog: when the console cannot reach
// the database, the page says so and sends the operator to the log; it does
// not show the driver's error, which names the database user and host.
func TestErrorPagesKeepTheDriversWordsInTheLog(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	pool, err := pgxpool.New(t.Context(), "postgres://billing_user_7@"+addr+"/billing_db_7?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var log logbuf.Buffer
	b := &testBundle{pool: pool}
	c := b.start(t, console.Config{Operator: "ivan", Logger: slog.New(slog.NewTextHandler(&log, nil))})
	code, _, body := c.do("GET", "/failed", nil, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot use the database right now; its log has the driver") {
		t.Errorf("the Failed page without a database: %d, want 503 pointing to the log\n%s", code, body)
	}
	for _, secret := range []string{"billing_user_7", "billing_db_7", addr} {
		if strings.Contains(body, secret) {
			t.Errorf("the error page shows %q:\n%s", secret, body)
		}
	}
	if !strings.Contains(log.String(), "billing_user_7") {
		t.Errorf("the log lacks the driver's error:\n%s", log.String())
	}
}
