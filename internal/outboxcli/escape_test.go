package outboxcli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// hostile is what a message may carry into stored values: an OSC 52
// clipboard write, a CSI that clears the screen, the one-byte C1 CSI
// (U+009B), DEL and a right-to-left override.
const hostile = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u009b31m\x7f\u202e"

// rawControls lists the characters of out a terminal would act on (or
// that would reorder what follows): anything unprintable but newline and
// tab.
func rawControls(out string) []rune {
	var bad []rune
	for _, r := range out {
		if r != '\n' && r != '\t' && !unicode.IsPrint(r) {
			bad = append(bad, r)
		}
	}
	return bad
}

// TestStoredValuesAreEscaped: every outbox command that prints a stored
// value (message key, ordering key, last_error, errcode, the breaker's
// reason) prints it escaped, in text and in JSON, so a message cannot write
// to the operator's terminal or clipboard.
func TestStoredValuesAreEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := fixture.New(t, b.pool)
	key, orderKey := "m-"+hostile, "P1/"+hostile
	ids := db.Insert(
		fixture.Row{Key: key, Status: "FAILED", OrderingKey: orderKey, OrderBlocked: true, LastError: "http 200: " + hostile,
			PlateNo: "粤B" + hostile, ParkCode: "P1", BerthCode: hostile, DeviceID: hostile, Age: time.Hour},
		fixture.Row{Key: "held-" + hostile, OrderingKey: orderKey, OrderHeld: true, Age: 2 * time.Hour},
		fixture.Row{Key: "oldest-" + hostile, Age: 3 * time.Hour},
	)
	db.Exec(`INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number, result_status, http_status,
		platform_errcode, error_message)
		SELECT id, created_at, 1, 'FAILED', 200, $2, $3 FROM forward_messages WHERE id = $1`, ids[0], "9"+hostile, "http 200: "+hostile)
	if _, err := outboxdb.SetBreaker(context.Background(), b.pool, []string{"CLOSED"}, "OPEN", "test", "HTTP 503: "+hostile, time.Minute); err != nil {
		t.Fatal(err)
	}

	// Each command, and what must show that the value was there, escaped.
	escapedESC := `\u{001b}]52;c;ZXZpbA==\u{0007}\u{001b}[2J\u{009b}31m\u{007f}\u{202e}`
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"Stats", []string{"stats"}, []string{
			"key oldest-" + escapedESC, // the oldest undelivered row
			"P1/" + escapedESC,         // the blocked ordering key
			"http 200: " + escapedESC,  // the failure reason
			"9" + escapedESC,           // the errcode
			"(HTTP 503: " + escapedESC, // the breaker's reason
			"m-" + escapedESC + "  ",   // the blocked row's key
		}},
		{"StatsJSON", []string{"stats", "--json"}, []string{`"message_key": "oldest-\u001b]52;c;ZXZpbA==\u0007\u001b[2J\u009b31m\u007f\u202e"`}},
		{"ReleaseDryRun", []string{"release", "--key", orderKey, "--dry-run"}, []string{"ordering key P1/" + escapedESC + ": FAILED row"}},
		{"Show", []string{"show", "--mappings", "../../mappings", key}, []string{"m-" + escapedESC, "http 200: " + escapedESC}},
		{"ShowJSON", []string{"show", "--json", "--mappings", "../../mappings", strconv.FormatInt(ids[0], 10)},
			[]string{`"message_key": "m-\u001b]52;c;ZXZpbA==\u0007\u001b[2J\u009b31m\u007f\u202e"`}},
		{"Find", []string{"find", "--park", "P1"}, []string{"m-" + escapedESC}},
		{"FindJSON", []string{"find", "--park", "P1", "--json"}, []string{`"m-\u001b]52;c;ZXZpbA==\u0007\u001b[2J\u009b31m\u007f\u202e"`}},
		// An error that quotes a stored value.
		{"ReleaseError", []string{"release", "--id", strconv.FormatInt(ids[1], 10)}, []string{`P1/`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := b.run(t, c.args...)
			if err != nil {
				out += "\n" + err.Error()
			}
			if bad := rawControls(out); len(bad) > 0 {
				t.Errorf("outbox %v printed %q raw:\n%s", c.args, bad, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("outbox %v: output lacks %q:\n%s", c.args, w, out)
				}
			}
			if strings.HasSuffix(c.name, "JSON") {
				// Still JSON, and the values read back exactly.
				line, _, _ := strings.Cut(out, "\n{")
				if c.name != "FindJSON" {
					line = out
				}
				var v any
				if err := json.Unmarshal([]byte(line), &v); err != nil {
					t.Fatalf("not JSON any more: %v\n%s", err, out)
				}
				if !strings.Contains(jsonStrings(v), hostile) {
					t.Errorf("the JSON no longer holds the stored value exactly:\n%s", out)
				}
			}
		})
	}
}

// jsonStrings joins every string of a decoded JSON value.
func jsonStrings(v any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			b.WriteString(x)
			b.WriteByte(0)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				b.WriteString(k)
				b.WriteByte(0)
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}

// TestOperatorNameIsEscaped: the operator's name comes from --operator or
// $USER, and goes into the audit log the console shows. pause and resume
// printed it escaped; requeue and purge wrote it to the terminal raw.
func TestOperatorNameIsEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, row{key: "f1", status: "FAILED", attempts: 5, class: "TRANSIENT"})
	for _, args := range [][]string{
		{"requeue", "--operator", "alice" + hostile},
		{"purge", "--older-than", "30d", "--operator", "alice" + hostile},
		{"pause", "--operator", "alice" + hostile},
		{"resume", "--operator", "alice" + hostile},
	} {
		out := b.mustRun(t, args...)
		if bad := rawControls(out); len(bad) > 0 {
			t.Errorf("%s printed %q raw:\n%s", args[0], bad, out)
		}
	}
}
