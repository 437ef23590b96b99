package console_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/dev/childproc"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The browser test needs Debian's chromium (`make deps` and .ci/run install
// it); CHROMIUM_BIN names another binary. With UPDATE_SCREENSHOTS=1 it
// writes the screenshots docs/operations.md shows into docs/images/;
// otherwise into a temporary directory, so a test run leaves the tree as it
// was.
const (
	browserToken    = "browser-test-token-5f2b9c0e7a41-8d6c"
	browserOperator = "alice"
	targetPlate     = "粤B12345"
	platformName    = "console-browser-test"
	platformPwd     = "console-browser-test-pwd-9d2e"
	topicVehicle    = "device-vehicle-event"
	topicHeartbeat  = "device-heartbeat"
)

// TestBrowser runs the console in headless Chromium against the real
// forwarder (bin/forwarder with an in-process Kafka and the mock platform):
// the operator logs in, sees the overview and logs out, after which the
// session's cookie opens nothing; a vehicle event the platform refuses
// (errcode 998) is FAILED; the operator logs in again, searches its plate, opens the row, requeues it with the
// confirmation step and sees it PENDING; the forwarder, started again with
// the platform accepting, delivers it, and a reload shows SUCCESS with its
// attempts numbered over the row's life. On the way, in a 1280 px window,
// it checks what the pages show: a Retry-After pause only while one is in
// force (overview), the class table apart from the groups (Failed), no
// identifier or time broken over two lines and the whole Since hint
// (Search); it takes the screenshots docs/operations.md shows. The console
// listens on a non-loopback address of this machine, so it needs its
// token, and a request without it is refused.
func TestBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	bin := forwarderBinary(t)
	ip := nonLoopbackIP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	dsn, pool := pgtest.NewDBPool(t)
	kafka := kafkatest.New(t, []kafkatest.Topic{{Name: topicVehicle, Partitions: 1}, {Name: topicHeartbeat, Partitions: 1}})
	platform, err := mockplatform.Start(mockplatform.Config{AccessName: platformName, AccessPwd: platformPwd, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = platform.Close() })
	env := map[string]string{
		"KAFKA_BROKERS": kafka.Brokers(), "KAFKA_GROUP": "console-browser", "DATABASE_URL": dsn,
		"PLATFORM_URL": platform.URL, "PLATFORM_ACCESS_NAME": platformName, "PLATFORM_ACCESS_PWD": platformPwd,
		"FORWARD_RETRY_INITIAL": "200ms", "FORWARD_RETRY_MAX": "1s", "CLAIM_LEASE": "5s", "FORWARD_TIMEOUT": "2s",
		"SHUTDOWN_TIMEOUT": "10s",
	}

	// Traffic for the overview: delivered events, then events the platform
	// refuses, the searched one among them, and one that fails its mapping.
	var recs []*kgo.Record
	for i := range 24 {
		recs = append(recs, vehicleRecord(fmt.Sprintf("ok-%02d", i), fmt.Sprintf("粤A%05d", 10000+i), 1))
	}
	for i := range 6 {
		recs = append(recs, &kgo.Record{Topic: topicHeartbeat, Value: fmt.Appendf(nil,
			`{"messageId":"hb-%d","deviceId":"CAM-00%02d","parkCode":"P1001","berthCode":"B-0%02d","captureTime":1779330900000,"picType":3,"picUrl":"hb.jpg"}`, i, i, i)})
	}
	kafka.Produce(t, recs...)
	fwd := startForwarder(t, bin, env)
	waitRows(ctx, t, pool, "30 rows SUCCESS", "SELECT count(*) = 30 FROM forward_records WHERE status = 'SUCCESS'")

	if err := platform.SetFaults(mockplatform.Faults{Errcode998: 1}); err != nil {
		t.Fatal(err)
	}
	kafka.Produce(t, vehicleRecord("target", targetPlate, 0), vehicleRecord("refused-1", "粤C77777", 1),
		vehicleRecord("refused-2", "粤C88888", 0), vehicleRecord("bad-inout", "粤D00001", 7))
	waitRows(ctx, t, pool, "the refused and invalid rows FAILED", "SELECT count(*) = 4 FROM forward_records WHERE status = 'FAILED'")
	if err := fwd.Stop(20 * time.Second); err != nil {
		t.Fatalf("stopping the forwarder: %v", err)
	}

	// The console, on this machine's non-loopback address.
	srv, err := console.New(console.Config{Addr: net.JoinHostPort(ip, "0"), Token: browserToken, Operator: "nobody",
		MappingsDir: "../../mappings"}, pool)
	if err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	runCtx, stopConsole := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Run(runCtx, func(a string) { addrCh <- a }); err != nil {
			t.Errorf("console: %v", err)
		}
	}()
	t.Cleanup(func() { stopConsole(); wg.Wait() })
	base := "http://" + <-addrCh

	// Without the token: refused, and nothing personal in the answer.
	for _, p := range []string{"/", "/search?plate=" + targetPlate} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body.String(), targetPlate) {
			t.Errorf("GET %s%s without the token: %d %q, want 401", base, p, resp.StatusCode, body.String())
		}
	}

	shots := t.TempDir()
	if os.Getenv("UPDATE_SCREENSHOTS") != "" {
		shots = "../../docs/images"
	}
	browser := newBrowser(ctx, t, chromium)
	// Each step gets its own timeout, derived from the browser's context
	// (a timeout on that one would stop the browser).
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			// Where the browser is, to see what went wrong.
			lctx, lcancel := context.WithTimeout(browser, 5*time.Second)
			defer lcancel()
			loc, _ := chromedp.Run(lctx, chromedp.Location())
			body, _ := chromedp.Run(lctx, chromedp.Text(chromedp.CSS("body")))
			t.Fatalf("browser: %s: %v\nat %s:\n%s", what, err, loc, body)
		}
	}
	text := func(id string) string {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 30*time.Second)
		defer scancel()
		s, err := chromedp.Run(sctx, chromedp.Text(chromedp.ID(id)))
		if err != nil {
			t.Fatalf("browser: reading #%s: %v", id, err)
		}
		return strings.TrimSpace(s)
	}
	bodyText := func() string {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 30*time.Second)
		defer scancel()
		s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS("main")))
		if err != nil {
			t.Fatalf("browser: reading the page: %v", err)
		}
		return s
	}
	screenshot := func() []byte {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 30*time.Second)
		defer scancel()
		b, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("browser: screenshot: %v", err)
		}
		return b
	}

	logIn := func() {
		t.Helper()
		do("log in",
			chromedp.Navigate(base+"/"),
			chromedp.WaitVisible(chromedp.ID("name")),
			chromedp.SendKeys(chromedp.ID("name"), browserOperator),
			chromedp.SendKeys(chromedp.ID("token"), browserToken),
			chromedp.Click(chromedp.ID("login")),
			chromedp.WaitVisible(chromedp.ID("by-status")),
		)
	}

	// The login path: log in with the token, see the overview, log out;
	// the session ends on the server, so its cookie, wherever a copy was
	// kept, opens nothing any more.
	logIn()
	if who := text("operator"); who != browserOperator {
		t.Fatalf("the overview names %q, want %s", who, browserOperator)
	}
	session := sessionCookie(t, browser)
	if code := getWithCookie(t, base+"/", session); code != http.StatusOK {
		t.Fatalf("GET / with the session's cookie: %d, want 200", code)
	}
	do("log out",
		chromedp.Click(chromedp.ID("logout")),
		chromedp.WaitVisible(chromedp.ID("token")),
	)
	if code := getWithCookie(t, base+"/", session); code != http.StatusUnauthorized {
		t.Fatalf("GET / with the cookie of the ended session: %d, want 401", code)
	}
	do("the overview after logging out", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("token")))

	logIn()
	overviewPNG := screenshot()
	// paused_until holds 'epoch' (never paused): no pause is shown; one in
	// force is.
	if body := strings.ToLower(text("by-status") + bodyText()); strings.Contains(body, "sending paused") || strings.Contains(body, "1970") {
		t.Errorf("the overview shows a pause that is not in force:\n%s", body)
	}
	if _, err := pool.Exec(ctx, "UPDATE forward_platform_state SET paused_until = now() + interval '10 minutes'"); err != nil {
		t.Fatal(err)
	}
	do("the overview during a pause", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("paused")))
	if paused := text("paused"); !strings.HasPrefix(paused, "Sending paused (Retry-After) until 20") {
		t.Errorf("a pause in force reads %q", paused)
	}
	if _, err := pool.Exec(ctx, "UPDATE forward_platform_state SET paused_until = 'epoch'"); err != nil {
		t.Fatal(err)
	}

	// Pausing delivery and resuming it with the overview's buttons, as the
	// operator logged in, each in the operator log.
	do("pausing delivery",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.ID("pause")),
		chromedp.SendKeys(chromedp.ID("pause-until"), "45m"),
		chromedp.SendKeys(chromedp.ID("pause-reason"), "platform maintenance"),
		chromedp.Click(chromedp.ID("pause")),
		chromedp.WaitVisible(chromedp.ID("resume")),
	)
	if p := text("delivery-pause"); !strings.Contains(p, "PAUSED by "+browserOperator) || !strings.Contains(p, "platform maintenance") {
		t.Errorf("the overview while paused reads %q", p)
	}
	pausedPNG := screenshot()
	do("resuming delivery", chromedp.Click(chromedp.ID("resume")), chromedp.WaitVisible(chromedp.ID("pause")))
	if p := text("delivery-pause"); !strings.Contains(p, "running") {
		t.Errorf("the overview after resume reads %q", p)
	}
	var actions string
	if err := pool.QueryRow(ctx, "SELECT string_agg(action || ' by ' || operator, ', ' ORDER BY id) FROM forward_operator_log").Scan(&actions); err != nil {
		t.Fatal(err)
	}
	if want := "pause by " + browserOperator + ", resume by " + browserOperator; actions != want {
		t.Errorf("operator log %q, want %q", actions, want)
	}

	// The Failed page: the class table and the groups table apart.
	do("the failed rows", chromedp.Navigate(base+"/failed"), chromedp.WaitVisible(chromedp.ID("groups")))
	if gap := evaluate[float64](t, browser, `document.getElementById("groups").getBoundingClientRect().top - document.getElementById("failed-classes").getBoundingClientRect().bottom`); gap < 16 {
		t.Errorf("the class table and the groups table are %.0f px apart, want them separated", gap)
	}
	failedPNG := screenshot()

	// The Search page, at 1280 px: no plate, device id or time breaks in
	// two, and the Since field shows its whole hint.
	do("a search by park",
		chromedp.Navigate(base+"/search?park=P1001&limit=12"),
		chromedp.WaitVisible(chromedp.ID("results")),
	)
	if note := bodyText(); !strings.Contains(note, "12 rows for ") {
		t.Errorf("the search does not say how many rows:\n%s", note)
	}
	// A cell is on one line when the boxes of its text (and of a badge in
	// it) all overlap vertically; text wrapped onto a second line starts
	// below the first's bottom.
	// Columns: id, created, status, attempts, errcode, api_type, plate, park,
	// berth, device; the last error may wrap.
	if broken := evaluate[[]string](t, browser, `Array.from(document.querySelectorAll("#results tr td:not(:last-child)")).filter(td => {
			const r = document.createRange(); r.selectNodeContents(td);
			const boxes = Array.from(r.getClientRects()).filter(q => q.width > 0).sort((a, b) => a.top - b.top);
			return boxes.some(q => q.top >= boxes[0].bottom - 1);
		}).map(td => td.textContent.trim())`); len(broken) > 0 {
		t.Errorf("cells broken over lines on the search page: %q", broken)
	}
	if fits := evaluate[bool](t, browser, `(() => { const i = document.getElementById("since"); const v = i.value;
			i.value = i.placeholder; const ok = i.scrollWidth <= i.clientWidth; i.value = v; return ok; })()`); !fits {
		t.Error(`the Since field cuts its placeholder "2h, 7d or 2026-05-21 10:30"`)
	}
	searchPNG := screenshot()

	do("search the plate",
		chromedp.Navigate(base+"/search"),
		chromedp.WaitVisible(chromedp.ID("plate")),
		// Typed key events carry ASCII only; a plate has a Chinese
		// character, which an input method would enter: set the value.
		chromedp.SetValue(chromedp.ID("plate"), targetPlate),
		chromedp.Click(chromedp.ID("search")),
		chromedp.WaitVisible(chromedp.ID("results")),
	)
	if results := text("results"); !strings.Contains(results, targetPlate) || !strings.Contains(results, "FAILED") || strings.Count(results, "粤") != 1 {
		t.Fatalf("search results for %s: %q", targetPlate, results)
	}
	do("open the record",
		chromedp.Click(chromedp.CSS("a.record-link")),
		chromedp.WaitVisible(chromedp.ID("payload")),
	)
	if status := text("status"); status != "FAILED" {
		t.Fatalf("record status %q, want FAILED", status)
	}
	do("requeue with confirmation",
		chromedp.Click(chromedp.ID("requeue")),
		chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm")),
		chromedp.WaitVisible(chromedp.ID("flash")),
	)
	if status, flash := text("status"), text("flash"); status != "PENDING" || !strings.Contains(flash, "Requeued") {
		t.Fatalf("after the requeue: status %q, flash %q; want PENDING", status, flash)
	}
	var who string
	if err := pool.QueryRow(ctx, "SELECT operator FROM forward_operator_log ORDER BY id DESC LIMIT 1").Scan(&who); err != nil || who != browserOperator {
		t.Errorf("operator log names %q (%v), want %s", who, err, browserOperator)
	}

	// The forwarder, back with a platform that accepts, delivers it.
	if err := platform.SetFaults(mockplatform.Faults{}); err != nil {
		t.Fatal(err)
	}
	startForwarder(t, bin, env)
	waitRows(ctx, t, pool, "the requeued row SUCCESS", "SELECT status = 'SUCCESS' FROM forward_records WHERE message_key = 'target'")
	// A fresh load of the row's page (its URL without the flash message).
	recordURL, err := chromedp.Run(browser, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	recordURL, _, _ = strings.Cut(recordURL, "?")
	do("reload", chromedp.Navigate(recordURL), chromedp.WaitVisible(chromedp.ID("attempts")))
	if status := text("status"); status != "SUCCESS" {
		t.Fatalf("after the delivery and a reload: status %q, want SUCCESS", status)
	}
	// Refused, requeued, delivered: the attempts are numbered over the
	// row's life, not from 1 again after the requeue.
	steps := evaluate[[]string](t, browser, `Array.from(document.querySelectorAll("#attempts li b")).map(b => b.textContent.trim())`)
	if want := []string{"#1 FAILED", "#1 REQUEUED", "#2 SUCCESS"}; !slices.Equal(steps, want) {
		t.Errorf("the attempt timeline reads %q, want %q", steps, want)
	}
	recordPNG := screenshot()

	for name, b := range map[string][]byte{"console-overview.png": overviewPNG, "console-record.png": recordPNG,
		"console-failed.png": failedPNG, "console-search.png": searchPNG, "console-paused.png": pausedPNG} {
		img, err := png.Decode(bytes.NewReader(b))
		// 1280 px wide: the window the pages are checked at.
		if err != nil || img.Bounds().Dx() != 1280 || img.Bounds().Dy() < 400 {
			t.Errorf("screenshot %s: %v, %v", name, err, img)
			continue
		}
		if err := os.WriteFile(filepath.Join(shots, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", shots)

	otherSitesMayOnlyLink(t, browser, pool)
}

// otherSitesMayOnlyLink: a console without a token, on loopback, answers
// whatever this browser asks, so a page of another site (127.0.0.2 is
// another site to the browser, and a loopback one, so Chromium sends it
// Fetch Metadata) must not make the browser fetch from it: its <img> and its
// script's fetch are refused, 403, while its link opens the console. Without
// the refusal both would read the search page, 200.
func otherSitesMayOnlyLink(t *testing.T, browser context.Context, pool *pgxpool.Pool) {
	t.Helper()
	srv, err := console.New(console.Config{Addr: "127.0.0.1:0", Operator: "nobody", MappingsDir: "../../mappings"}, pool)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // "dest site status path" of each request the console answered
	consoleURL := serve(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		srv.ServeHTTP(rec, r)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %s %d %s", r.Header.Get("Sec-Fetch-Dest"), r.Header.Get("Sec-Fetch-Site"), rec.status, r.URL.Path))
	}))
	search := consoleURL + "/search?plate=" + targetPlate
	otherURL := serve(t, "127.0.0.2:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>elsewhere</title>
<img id="img" src="%[1]s&by=img" onload="document.title='img'" onerror="document.title='img'">
<script>fetch(%[1]q + "&by=fetch", {mode: "no-cors"}).finally(() => { document.body.dataset.fetched = "yes"; });</script>
<a id="link" href="%[2]s/">console</a>`, search, consoleURL)
	}))

	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	defer cancel()
	err = chromedp.Do(ctx,
		chromedp.Navigate(otherURL+"/"),
		chromedp.WaitVisible(chromedp.ID("link")),
		chromedp.Poll[chromedp.Void](`document.title === "img" && document.body.dataset.fetched === "yes"`),
		chromedp.Click(chromedp.ID("link")),
		chromedp.WaitVisible(chromedp.ID("by-status")),
	)
	if err != nil {
		t.Fatalf("browser: another site's page and its link to the console: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"image cross-site 403 /search", "empty cross-site 403 /search", "document cross-site 200 /"}
	for _, w := range want {
		if !slices.Contains(seen, w) {
			t.Errorf("the console answered %q to another site's page; want among them %q", seen, w)
		}
	}
}

// serve runs h on addr until the test ends and returns its base URL.
func serve(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return "http://" + ln.Addr().String()
}

// statusRecorder keeps the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// sessionCookie is the value of the console's session cookie in the
// browser (HttpOnly: only the DevTools protocol reads it).
func sessionCookie(t *testing.T, browser context.Context) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	defer cancel()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		t.Fatalf("browser: reading cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == "forwarder_console" {
			if !c.HTTPOnly || strings.Contains(c.Value, browserToken) {
				t.Errorf("session cookie: HttpOnly %v, holds the token %v", c.HTTPOnly, strings.Contains(c.Value, browserToken))
			}
			return c.Value
		}
	}
	t.Fatal("browser: no session cookie after logging in")
	return ""
}

// getWithCookie GETs url as a script would, with only the session cookie.
func getWithCookie(t *testing.T, url, session string) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: "forwarder_console", Value: session})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func vehicleRecord(id, plate string, inout int) *kgo.Record {
	return &kgo.Record{Topic: topicVehicle, Value: fmt.Appendf(nil,
		`{"messageId":"%s","deviceId":"CAM-0001","parkCode":"P1001","berthCode":"B-012","itemId":73421,"plateNo":"%s",`+
			`"plateColor":1,"inoutType":%d,"inoutTime":1779330600000,"plateCredible":0.854,`+
			`"pictures":[{"picType":1,"picUrl":"jieshun/2026/05/21/P1001/a.jpg"}]}`, id, plate, inout)}
}

// evaluate runs a script in the page (DevTools evaluates it; the page's
// own policy runs none) and returns its result.
func evaluate[T any](t *testing.T, browser context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("browser: evaluating %s: %v", expr, err)
	}
	return v
}

// chromiumPath finds the browser, failing (not skipping) when it is missing:
// the browser test is part of the suite.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM_BIN"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the console's browser test needs Chromium: install Debian's chromium package (make deps does), or set CHROMIUM_BIN")
	return ""
}

// nonLoopbackIP is an IPv4 address of this machine that is not loopback.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address: the browser test needs one to check that a console listening beyond loopback refuses requests without its token")
	return ""
}

// forwarderBinary is FORWARDER_BIN (make test passes the binary it built),
// or one built now.
func forwarderBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("FORWARDER_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(t.TempDir(), "forwarder")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/forwarder")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building ./cmd/forwarder: %v\n%s", err, out)
	}
	return bin
}

// startForwarder runs the shipped pipeline from the repository root and
// waits until it answers /ping; it is killed at the end of the test.
func startForwarder(t *testing.T, bin string, env map[string]string) *childproc.Process {
	t.Helper()
	addr, err := childproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "forwarder.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	all := map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"), "TMPDIR": os.TempDir(), "HTTP_ADDR": addr}
	for k, v := range env {
		all[k] = v
	}
	p, err := childproc.Start(childproc.Spec{Path: bin, Args: []string{"-c", "pipelines/forwarder.yaml"}, Dir: "../..",
		Env: all, Output: logFile, ParentDeath: syscall.SIGKILL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !p.Exited() {
			p.Kill()
			<-p.Done()
		}
		if t.Failed() {
			t.Logf("forwarder log (%s):\n%s", logPath, childproc.TailFile(logPath, 4000))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitPing(ctx, addr); err != nil {
		t.Fatalf("forwarder: %v\n%s", err, childproc.TailFile(logPath, 4000))
	}
	return p
}

// waitRows polls sql (one boolean) until it is true.
func waitRows(ctx context.Context, t *testing.T, pool *pgxpool.Pool, what, sql string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		var ok bool
		err := pool.QueryRow(wctx, sql).Scan(&ok)
		if err == nil && ok {
			return
		}
		select {
		case <-wctx.Done():
			var counts string
			_ = pool.QueryRow(ctx, "SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) n FROM forward_records GROUP BY 1) c").Scan(&counts)
			t.Fatalf("waiting for %s: %v (rows: %s)", what, err, counts)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// newBrowser starts headless Chromium with a fresh profile, with the flags
// that keep it from calling home, and closes it at the end of the test.
func newBrowser(ctx context.Context, t *testing.T, path string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting Chromium (%s): %v", path, err)
	}
	return bctx
}
