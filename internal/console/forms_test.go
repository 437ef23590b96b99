package console_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
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
