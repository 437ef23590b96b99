package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestConsolePause: the overview's buttons pause and resume delivery as
// `outbox pause` and `outbox resume` do, behind the CSRF check, recorded
// in the operator log under the console user's name; a read-only console
// offers neither and refuses both.
func TestConsolePause(t *testing.T) {
	t.Parallel()
	shared := func(t *testing.T, b *testBundle) outboxdb.DeliveryPause {
		t.Helper()
		s, err := outboxdb.ReadPlatformState(context.Background(), b.pool)
		if err != nil {
			t.Fatal(err)
		}
		return s.Pause
	}

	t.Run("PauseAndResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{Operator: "alice"})
		overview := c.get("/")
		if !strings.Contains(overview, `id="pause"`) || !strings.Contains(overview, `<span class="state state-closed">running</span>`) {
			t.Fatalf("the overview offers no pause:\n%s", overview)
		}
		form := url.Values{"until": {"2h"}, "reason": {`<script>alert("x")</script> upgrade`}}
		if code, _, _ := c.do("POST", "/delivery/pause", form, nil); code != http.StatusForbidden || shared(t, b).InForce {
			t.Fatalf("a pause without the CSRF token: %d", code)
		}
		form.Set("csrf", csrfOf(t, overview))
		code, h, _ := c.do("POST", "/delivery/pause", form, nil)
		if code != http.StatusSeeOther {
			t.Fatalf("pause: %d", code)
		}
		p := shared(t, b)
		if !p.InForce || p.By != "alice" || p.Left < 119*60e9 || p.Reason != `<script>alert("x")</script> upgrade` {
			t.Fatalf("after the console's pause: %+v", p)
		}
		page := c.get(h.Get("Location"))
		for _, want := range []string{"Delivery paused until ", `<span class="state state-open">PAUSED</span> by <b>alice</b>`, `id="resume"`,
			"&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; upgrade"} {
			if !strings.Contains(page, want) {
				t.Errorf("the overview while paused lacks %q:\n%s", want, page)
			}
		}
		code, h, _ = c.do("POST", "/delivery/resume", url.Values{"csrf": {csrfOf(t, page)}}, nil)
		if code != http.StatusSeeOther || shared(t, b).InForce {
			t.Fatalf("resume: %d, %+v", code, shared(t, b))
		}
		if page := c.get(h.Get("Location")); !strings.Contains(page, "Delivery resumed") || !strings.Contains(page, "last paused by alice") {
			t.Errorf("the overview after resume:\n%s", page)
		}
		log := b.operatorLog(t)
		// Newest first.
		if len(log) != 2 || log[1].Action != "pause" || log[1].Operator != "alice" || !strings.HasPrefix(log[1].Filter, "until ") ||
			log[0].Action != "resume" || log[0].Operator != "alice" {
			t.Errorf("operator log %+v", log)
		}
	})

	t.Run("BadUntil", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{Operator: "alice"})
		code, _, body := c.do("POST", "/delivery/pause", url.Values{"csrf": {csrfOf(t, c.get("/"))}, "until": {"yesterday"}}, nil)
		if code != http.StatusBadRequest || !strings.Contains(body, "neither an RFC 3339 time") || shared(t, b).InForce {
			t.Errorf("a pause until yesterday: %d\n%s", code, body)
		}
	})

	t.Run("ReadOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(t, console.Config{ReadOnly: true})
		if overview := c.get("/"); strings.Contains(overview, `id="pause"`) || strings.Contains(overview, "/delivery/") {
			t.Errorf("a read-only overview offers pause:\n%s", overview)
		}
		for _, path := range []string{"/delivery/pause", "/delivery/resume"} {
			if code, _, _ := c.do("POST", path, url.Values{}, nil); code != http.StatusForbidden {
				t.Errorf("read-only POST %s: %d", path, code)
			}
		}
		if shared(t, b).InForce {
			t.Error("a read-only console paused delivery")
		}
	})
}
