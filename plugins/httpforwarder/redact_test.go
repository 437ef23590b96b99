package httpforwarder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// Credentials with the characters each encoding treats specially: JSON (`"`
// `/`, HTML-sensitive & < >, non-ASCII, beyond the BMP), URLs (& / + space
// #), HTML (& < > " ').
const (
	redactName = `gw/äccess&co"<op>`
	redactPwd  = `p"ä$$/w+r d&<x>#*!:'😀é`
)

// spelled are the reply texts the credentials are echoed in, each computed
// here independently of the redactor.
func spelled(s string) map[string]string {
	goJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	inner := func(q string) string { return q[1 : len(q)-1] }
	plainJSON := func(v any) string { // Jackson, most libraries: no HTML escapes
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		return strings.TrimSpace(b.String())
	}
	eachRune := func(format string) string {
		var b strings.Builder
		for _, c := range s {
			if c > 0xFFFF {
				c -= 0x10000
				fmt.Fprintf(&b, format, 0xD800+(c>>10))
				fmt.Fprintf(&b, format, 0xDC00+(c&0x3FF))
				continue
			}
			fmt.Fprintf(&b, format, c)
		}
		return b.String()
	}
	// Escapes only some characters, as a hand-written encoder might.
	someEscaped := func() string {
		var b strings.Builder
		for i, c := range s {
			switch {
			case i%3 == 0 && c < utf8.RuneSelf:
				fmt.Fprintf(&b, `\u%04X`, c)
			case c == '"' || c == '\\':
				b.WriteString(`\` + string(c))
			default:
				b.WriteRune(c)
			}
		}
		return b.String()
	}
	ascii := strings.NewReplacer("ä", `\u00e4`, "é", `\u00e9`, "😀", `\ud83d\ude00`)
	body := `{"access_name":` + goJSON(redactName) + `,"access_pwd":` + goJSON(redactPwd) + `,"message_id":"m-1"}`
	return map[string]string{
		"Raw":          s,
		"GoJSON":       inner(goJSON(s)),
		"Jackson":      inner(plainJSON(s)),
		"PHP":          strings.ReplaceAll(ascii.Replace(inner(plainJSON(s))), "/", `\/`),
		"Python":       ascii.Replace(inner(plainJSON(s))),
		"DotNet":       dotNetJSON(s),
		"EveryRune":    eachRune(`\u%04x`),
		"SomeRunes":    someEscaped(),
		"URLQuery":     url.QueryEscape(s),
		"URLPath":      url.PathEscape(s),
		"URLLower":     strings.NewReplacer("%C3%A4", "%c3%a4", "%2F", "%2f").Replace(url.QueryEscape(s)),
		"URLJSUnicode": eachRune(`%%u%04X`),
		"HTML":         html.EscapeString(s),
		"HTMLNamed":    strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;", "ä", "&auml;", "é", "&eacute;").Replace(s),
		"HTMLDec":      eachRuneEntity(s, "&#%d;"),
		"HTMLHex":      eachRuneEntity(s, "&#x%x;"),
		"HTMLHexUp":    eachRuneEntity(s, "&#X%X;"),
		"B64":          base64.StdEncoding.EncodeToString([]byte(s)),
		"B64Raw":       base64.RawStdEncoding.EncodeToString([]byte(s)),
		"B64URL":       base64.URLEncoding.EncodeToString([]byte(s)),
		"B64URLRaw":    base64.RawURLEncoding.EncodeToString([]byte(s)),
		// The whole request body echoed back in other forms.
		"BodyB64":      base64.StdEncoding.EncodeToString([]byte(body)),
		"BodyB64URL":   base64.RawURLEncoding.EncodeToString([]byte("x" + body)),
		"BodyB64Off2":  base64.StdEncoding.EncodeToString([]byte("xy" + body)),
		"BodyInJSON":   inner(goJSON(body)),
		"BodyInJSONx2": inner(goJSON(goJSON(body))),
		"BodyURL":      url.QueryEscape(body),
		"BodyHTML":     html.EscapeString(body),
	}
}

// dotNetJSON spells s as System.Text.Json does by default: " < > & ' +
// and non-ASCII as upper-case \uXXXX.
func dotNetJSON(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c > 0xFFFF:
			c -= 0x10000
			fmt.Fprintf(&b, `\u%04X\u%04X`, 0xD800+(c>>10), 0xDC00+(c&0x3FF))
		case c >= utf8.RuneSelf || strings.ContainsRune(`"<>&'+`, c):
			fmt.Fprintf(&b, `\u%04X`, c)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func eachRuneEntity(s, format string) string {
	var b strings.Builder
	for _, c := range s {
		fmt.Fprintf(&b, format, c)
	}
	return b.String()
}

// TestRedactEchoedCredentials: however a platform spells the credentials it
// echoes back (JSON escapes of any library, URL encoding, HTML entities,
// base64, the request body inside JSON or base64), in a JSON reply, a
// non-JSON one or one too long to parse, they never reach last_error, the
// logs or the rules; the reply's other text survives; and a reply is
// scrubbed whole before it is cut, so a credential across the cut keeps
// none of its prefix.
func TestRedactEchoedCredentials(t *testing.T) {
	t.Parallel()
	r := newRedactor(redactName, redactPwd)
	for label, secret := range map[string]string{"Name": redactName, "Pwd": redactPwd} {
		for name, form := range spelled(secret) {
			if strings.HasPrefix(name, "Body") && label == "Name" {
				continue // the body holds both
			}
			// As the text of a JSON reply, in an HTML page, and past the
			// 64 KiB a reply is parsed up to.
			for _, wrap := range []struct {
				label string
				reply string
				json  bool
			}{
				{"JSON", `{"result":1,"errmsg":"KEEP-BEFORE ` + jsonEscapeForTest(form) + ` KEEP-AFTER"}`, true},
				{"HTML", "<html><body>KEEP-BEFORE " + form + " KEEP-AFTER</body></html>", false},
				{"Long", "KEEP-BEFORE " + form + " KEEP-AFTER " + strings.Repeat("x", maxResponseBytes), false},
			} {
				t.Run(label+"/"+name+"/"+wrap.label, func(t *testing.T) {
					t.Parallel()
					var body any
					if wrap.json {
						if err := json.Unmarshal([]byte(wrap.reply), &body); err != nil {
							t.Fatalf("bad test reply: %v", err)
						}
					}
					clean, snippet := r.reply([]byte(wrap.reply), body)
					checkRedacted(t, snippet, secret, form)
					if !strings.Contains(snippet, "KEEP-BEFORE ") || !strings.Contains(snippet, " KEEP-AFTER") || !strings.Contains(snippet, redacted) {
						t.Errorf("the reply's other text did not survive: %q", snippet)
					}
					if clean != nil {
						b, _ := json.Marshal(clean)
						var decoded struct{ Errmsg string }
						_ = json.Unmarshal(b, &decoded)
						checkRedacted(t, decoded.Errmsg, secret, form)
					}
				})
			}
		}
	}
	t.Run("AcrossTheCut", func(t *testing.T) {
		t.Parallel()
		for _, form := range spelled(redactPwd) {
			reply := `{"pad":"` + strings.Repeat("x", maxSnippetBytes-30) + `","errmsg":"` + form + `"}`
			_, snippet := r.reply([]byte(reply), nil)
			checkRedacted(t, snippet, redactPwd, form)
			if len(snippet) > maxSnippetBytes+len("…") {
				t.Errorf("snippet of %d bytes", len(snippet))
			}
		}
	})
	// A plain-text error page ends with a newline (Go's http.Error, most
	// proxies); the reason is one line.
	t.Run("SurroundingWhitespace", func(t *testing.T) {
		t.Parallel()
		for raw, want := range map[string]string{
			"internal server error\n": "internal server error",
			"\r\n  busy \t\r\n":       "busy",
			" \n":                     "",
		} {
			if _, snippet := r.reply([]byte(raw), nil); snippet != want {
				t.Errorf("snippet of %q = %q, want %q", raw, snippet, want)
			}
		}
	})
	t.Run("InAKey", func(t *testing.T) {
		t.Parallel()
		var body any
		_ = json.Unmarshal([]byte(`{"p\"\u00e4$$/w+r d&<x>#*!:'\ud83d\ude00\u00e9":1}`), &body)
		clean, snippet := r.reply([]byte(`{"p\"\u00e4$$/w+r d&<x>#*!:'\ud83d\ude00\u00e9":1}`), body)
		b, _ := json.Marshal(clean)
		if strings.Contains(string(b), "ä$$") || strings.Contains(snippet, `\u00e4$$`) {
			t.Errorf("a credential as a key survived: %s / %s", b, snippet)
		}
	})
	t.Run("TransportErrors", func(t *testing.T) {
		t.Parallel()
		if got := r.text(`Post "http://x/?p=` + url.QueryEscape(redactPwd) + `": refused`); strings.Contains(got, url.QueryEscape(redactPwd)) || !strings.Contains(got, `Post "http://x/?p=`) {
			t.Errorf("%q", got)
		}
	})
}

// jsonEscapeForTest puts form into a JSON string as is, escaping only what
// JSON requires, so the reply parses and holds exactly that spelling.
func jsonEscapeForTest(form string) string {
	var enc bytes.Buffer
	e := json.NewEncoder(&enc)
	e.SetEscapeHTML(false)
	_ = e.Encode(form)
	s := strings.TrimSpace(enc.String())
	return s[1 : len(s)-1]
}

// checkRedacted fails when text holds the credential, its spelling, or
// either half of either (a credential cut in two is still a leak).
func checkRedacted(t *testing.T, text, secret, form string) {
	t.Helper()
	for _, s := range []string{secret, form} {
		h := len(s) / 2
		for h > 0 && !utf8.RuneStart(s[h]) {
			h--
		}
		for _, part := range []string{s, s[:h], s[h:]} {
			if len(part) >= 6 && strings.Contains(text, part) {
				t.Errorf("%.300q still holds %q", text, part)
			}
		}
	}
}

// TestRedactKeepsOtherText: replies without the credentials come out as
// they went in, escapes, entities, base64 and near misses included.
func TestRedactKeepsOtherText(t *testing.T) {
	t.Parallel()
	r := newRedactor(redactName, redactPwd)
	nearMiss := strings.Replace(redactPwd, "w+r", "w+R", 1)
	for _, reply := range []string{
		`{"result":0,"errmsg":"ok"}`,
		`{"errmsg":"caf\u00e9 \/ \"quoted\" 50% off &amp; more","n":1}`,
		`<p>Fish &amp; chips &lt;3 &#x1F600; a+b=c 100%</p>`,
		`error: ` + url.QueryEscape(nearMiss) + " " + html.EscapeString(nearMiss) + " " + base64.StdEncoding.EncodeToString([]byte(nearMiss)),
		`{"token":"` + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("camera event "), 40)) + `"}`,
		`{"errmsg":"` + jsonEscapeForTest(nearMiss) + `"}`,
	} {
		if got := r.text(reply); got != reply {
			t.Errorf("text(%q)\n = %q", reply, got)
		}
	}
}

// BenchmarkRedactReply: what scrubbing costs a reply, the common small one
// and a 64 KiB error page with escapes.
func BenchmarkRedactReply(b *testing.B) {
	r := newRedactor(redactName, redactPwd)
	for _, c := range []struct {
		name  string
		reply []byte
	}{
		{"Small", []byte(`{"result":0,"errmsg":"success"}`)},
		{"ErrorPage64KiB", bytes.Repeat([]byte(`<p>Service &amp; gateway: 50% of requests \/ timed out + retried</p>`), maxResponseBytes/68)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.reply)))
			for b.Loop() {
				r.reply(c.reply, nil)
			}
		})
	}
}
