package httpforwarder

import (
	"encoding/base64"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestEchoesStayOutOfRowsAndLogs: a platform that echoes the request
// (credentials included) in a non-JSON reply, URL-encoded, as HTML, in
// base64, as a JSON string, or past the 64 KiB a reply is parsed up to,
// leaves them in no last_error, attempt log or log line: the texts the
// console and the dead-letter reason show.
func TestEchoesStayOutOfRowsAndLogs(t *testing.T) {
	t.Parallel()
	jackson := func(s string) string { // JSON without HTML escapes
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSpace(b.String())
	}
	for name, echo := range map[string]func(body []byte) string{
		"HTML": func(b []byte) string {
			return "<html><body>bad request: " + html.EscapeString(string(b)) + "</body></html>"
		},
		"URL":       func(b []byte) string { return "error=bad&request=" + url.QueryEscape(string(b)) },
		"Base64":    func(b []byte) string { return `{"result":1,"request":"` + base64.StdEncoding.EncodeToString(b) + `"}` },
		"JSONText":  func(b []byte) string { return `{"result":1,"errmsg":` + jackson(string(b)) + `}` },
		"PastLimit": func(b []byte) string { return string(b) + strings.Repeat(" ", maxResponseBytes) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{handler: func(w http.ResponseWriter, _ *http.Request, body []byte) {
				w.WriteHeader(500)
				_, _ = w.Write([]byte(echo(body)))
			}})
			row := b.claim(t, 1, outboxdb.APITypeVehicleEvent)[0]
			if err := b.out.WriteBatch(b.ctx, service.MessageBatch{message(row, mappedBody(row))}); err != nil {
				t.Fatal(err)
			}
			got := b.row(t, row.ID)
			texts := []string{str(got.LastError), b.logs.String()}
			for _, l := range got.Logs {
				texts = append(texts, str(l.Error))
			}
			for _, text := range texts {
				for _, s := range []string{"N4ME", "S3CRET", "TjRNRS", "UzNDUkVU", "M0NSRV", "0NSRVQ"} {
					if strings.Contains(text, s) {
						t.Errorf("%q leaked into %q", s, text)
					}
				}
			}
			if !strings.Contains(str(got.LastError), redacted) {
				t.Errorf("last_error %q shows no redaction", str(got.LastError))
			}
		})
	}
}
