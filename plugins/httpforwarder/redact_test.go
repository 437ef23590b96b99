package httpforwarder

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRedactEchoedCredentials: however a platform's JSON library spells the
// credentials it echoes back, they never reach last_error, the logs or the
// rules; and a reply is scrubbed whole before it is cut, so a credential
// across the cut keeps none of its prefix.
func TestRedactEchoedCredentials(t *testing.T) {
	t.Parallel()
	const name, pwd = "gw/äccess", "pä$$/wörd#*!: 😀"
	r := newRedactor(name, pwd)
	for _, tc := range []struct {
		label string
		body  string
	}{
		{"Raw", `{"errmsg":"bad password ` + pwd + ` for ` + name + `"}`},
		{"GoEscapes", mustJSON(map[string]string{"errmsg": "bad password " + pwd})},
		{"PHPSlashes", `{"errmsg":"bad password p\u00e4$$\/w\u00f6rd#*!: \ud83d\ude00","user":"gw\/\u00e4ccess"}`},
		{"PythonASCII", `{"errmsg": "bad password p\u00e4$$/w\u00f6rd#*!: \ud83d\ude00", "user": "gw/\u00e4ccess"}`},
		{"UpperHex", `{"errmsg":"p\u00E4$$/w\u00F6rd#*!: \uD83D\uDE00"}`},
		{"EveryCharacterEscaped", `{"echo":"\u0070\u00e4\u0024\u0024\u002f\u0077\u00f6\u0072\u0064\u0023\u002a\u0021\u003a\u0020\ud83d\ude00"}`},
		{"InAKey", `{"p\u00e4$$/w\u00f6rd#*!: \ud83d\ude00":1}`},
		{"AcrossTheCut", `{"pad":"` + strings.Repeat("x", maxSnippetBytes-30) + `","errmsg":"` + pwd + `"}`},
		{"NotJSON", `<html>denied for ` + pwd + `</html>`},
	} {
		t.Run(tc.label, func(t *testing.T) {
			t.Parallel()
			var body any
			if err := json.Unmarshal([]byte(tc.body), &body); err != nil {
				body = nil
			}
			clean, snippet := r.reply([]byte(tc.body), body)
			for _, secret := range []string{pwd, name, "p\\u00e4$$", "w\\u00f6rd", "ö", "$$/w", "$$\\/w"} {
				if strings.Contains(snippet, secret) {
					t.Errorf("snippet %q still holds %q", snippet, secret)
				}
			}
			if clean != nil {
				if b, _ := json.Marshal(clean); strings.Contains(string(b), "ö") {
					t.Errorf("the body the rules see still holds the password: %s", b)
				}
			}
			if len(snippet) > maxSnippetBytes+len("…") {
				t.Errorf("snippet of %d bytes", len(snippet))
			}
		})
	}
	t.Run("TransportErrors", func(t *testing.T) {
		if got := r.text(`Post "http://x/?p=` + pwd + `": refused`); strings.Contains(got, pwd) {
			t.Errorf("%q", got)
		}
	})
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
