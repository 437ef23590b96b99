package outboxcli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

// vehiclePayload is the vehicle event of the platform contract's example.
const vehiclePayload = `{"messageId": "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11", "deviceId": "CAM-0001",
 "parkCode": "P1001", "berthCode": "B-012", "itemId": 73421,
 "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1,
 "inoutTime": 1779330600000, "plateCredible": 0.854,
 "pictures": [{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"},
              {"picType": 3, "picUrl": "/jieshun/2026/05/21/P1001/b.jpg"}]}`

// lookupFixture inserts rows as ingest leaves them (lookup columns filled
// from the payload) and returns their ids by key.
func lookupFixture(t *testing.T, b *testBundle) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	db := fixture.New(t, b.pool)
	ids := map[string]int64{}
	add := func(key, status, class string, payload []byte, plate, park, berth, device, lastErr string, attempts int) {
		t.Helper()
		ids[key] = db.Insert(fixture.Row{Key: key, Status: status, FailureClass: class, Payload: payload,
			PlateNo: plate, ParkCode: park, BerthCode: berth, DeviceID: device, LastError: lastErr,
			Attempts: attempts, Partition: 2, Offset: 77, KafkaKey: []byte("\x1b[2J"), LastHTTPStatus: 200})[0]
	}
	add("8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11", "FAILED", "REJECTED", []byte(vehiclePayload), "粤B12345", "P1001", "B-012", "CAM-0001",
		`not retried (rules[1] no_retry): http 200: {"errcode":"998","errmsg":"do not resend","result":1}`, 1)
	add("other-plate", "SUCCESS", "", []byte(`{"plateNo":"粤A00001"}`), "粤A00001", "P1001", "B-013", "CAM-0002", "", 1)
	// Not UTF-8, with an escape sequence that would clear a terminal.
	add("binary", "FAILED", "INVALID", []byte("\xff\xfe\x1b[2Jplate"), "", "", "", "", "payload is not valid UTF-8 (first bad byte at offset 0)", 0)
	add("bad-mapping", "FAILED", "INVALID", []byte(`{"messageId":"m","deviceId":"d","parkCode":"p","berthCode":"b","plateNo":"x","inoutType":7,"inoutTime":1}`),
		"x", "p", "b", "d", "mapping: inoutType 7 is not 0 or 1", 0)
	for i, l := range [][3]string{{"PENDING", "999", "http 200: busy"}, {"LEASE_EXPIRED", "", ""}, {"FAILED", "998", "do not resend"}} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO forward_retry_logs (record_id, record_created_at, attempt_number,
			result_status, http_status, platform_errcode, error_message, duration_ms)
			SELECT id, created_at, $2, $3, 200, nullif($4, ''), nullif($5, ''), 12 FROM forward_messages WHERE id = $1`,
			ids["8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11"], i+1, l[0], l[1], l[2]); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// displayWidth counts the terminal columns of s: CJK characters take two
// (the plates of the fixture are all in the Basic Multilingual Plane).
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r >= 0x2E80 && r <= 0x9FFF || r >= 0xFF00 && r <= 0xFF60 {
			n++
		}
	}
	return n
}

// field is the value of a "label   value" line of outbox show.
func field(out, label string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, label+"  "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var ca, cb bytes.Buffer
	if err := json.Compact(&ca, a); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&cb, b); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

func exitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return -1
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := lookupFixture(t, b)
	const key = "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11"

	t.Run("ByKey", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "show", "--mappings", "../../mappings", key)
		for label, want := range map[string]string{
			"row":                           strconv.FormatInt(ids[key], 10),
			"status":                        "FAILED (REJECTED)",
			"last error":                    `not retried (rules[1] no_retry): http 200: {"errcode":"998","errmsg":"do not resend","result":1}`,
			"plate / park / berth / device": "粤B12345 / P1001 / B-012 / CAM-0001",
			// The Kafka key holds an escape sequence: shown escaped.
			"kafka": `topic device-vehicle-event, partition 2, offset 77, key "\\u{001b}[2J"`,
		} {
			if got := field(out, label); got != want {
				t.Errorf("%s: %q, want %q", label, got, want)
			}
		}
		for _, want := range []string{
			"payload (", "bytes, JSON, indented):\n{\n  \"messageId\": \"8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11\",",
			`  "plateNo": "粤B12345",`,
			"request body the current mapping would send (../../mappings/vehicle_event.blobl, credentials masked):\n{\n  \"access_name\": \"***\",\n  \"access_pwd\": \"***\",",
			`  "credibility": "85",`, `  "enter_state": "1",`, `  "event_time": "2026-05-21 10:30:00",`,
			"attempts (3):",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		// The timeline, in order.
		_, timeline, _ := strings.Cut(out, "attempts (3):")
		p, l, f := strings.Index(timeline, " PENDING "), strings.Index(timeline, " LEASE_EXPIRED "), strings.Index(timeline, " FAILED ")
		if p < 0 || l < p || f < l {
			t.Errorf("attempts not in order PENDING, LEASE_EXPIRED, FAILED:\n%s", out)
		}
	})

	t.Run("ByID", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "show", "--mappings", "../../mappings", strconv.FormatInt(ids["other-plate"], 10))
		if field(out, "message_key") != "other-plate" {
			t.Errorf("show by id found another row:\n%s", out)
		}
	})

	t.Run("NonUTF8AndEscapesNeverRaw", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "show", "--mappings", "../../mappings", "binary")
		if !utf8.ValidString(out) || strings.ContainsRune(out, 0x1b) {
			t.Errorf("raw bytes reached the terminal: %q", out)
		}
		if !strings.Contains(out, "payload (11 bytes, not valid UTF-8 from offset 0; escaped):\n\\xff\\xfe\\u{001b}[2Jplate") {
			t.Errorf("payload not shown escaped:\n%s", out)
		}
		// The mapping cannot read it: the row's own reason, not Bloblang's.
		if !strings.Contains(out, "request body (../../mappings/vehicle_event.blobl): none: no request: the mapping cannot read this payload "+
			"(the row's reason: payload is not valid UTF-8 (first bad byte at offset 0))") {
			t.Errorf("the preview of a payload that is not JSON does not give the row's reason:\n%s", out)
		}
	})

	t.Run("MappingError", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "show", "--mappings", "../../mappings", "bad-mapping")
		if !strings.Contains(out, "none: mapping: inoutType 7 is not 0 or 1") || !strings.Contains(out, "attempts: none") {
			t.Errorf("output:\n%s", out)
		}
	})

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "show", "--json", "--mappings", "../../mappings", key)
		var v struct {
			ID            int64           `json:"id"`
			Status        string          `json:"status"`
			FailureClass  string          `json:"failure_class"`
			PayloadBase64 string          `json:"payload_base64"`
			Payload       json.RawMessage `json:"payload"`
			Request       map[string]any  `json:"request"`
			Attempts      []struct {
				ResultStatus string `json:"result_status"`
			} `json:"attempts"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if v.ID != ids[key] || v.Status != "FAILED" || v.FailureClass != "REJECTED" || len(v.Attempts) != 3 ||
			v.Request["access_pwd"] != "***" || v.Request["plate_no"] != "粤B12345" || !sameJSON(t, v.Payload, []byte(vehiclePayload)) {
			t.Errorf("show --json: %+v", v)
		}
		// The fields docs/operations.md lists: the row's columns find
		// prints too, then what only show has.
		want := []string{"id", "message_key", "api_type", "status", "failure_class", "attempt_count", "last_error",
			"last_http_status", "plate_no", "park_code", "berth_code", "device_id", "created_at", "updated_at",
			"next_retry_at", "succeeded_at", "ordering_key", "order_held", "order_blocked", "failed_at", "requeue_rounds",
			"kafka_topic", "kafka_partition", "kafka_offset", "kafka_key_base64", "payload_base64", "payload", "request",
			"mapping", "attempts_total", "attempts"}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &fields); err != nil {
			t.Fatal(err)
		}
		got := slices.Sorted(maps.Keys(fields))
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("show --json fields %v, want %v", got, want)
		}
		if attempts := string(fields["attempts"]); !strings.Contains(attempts, `"attempted_at"`) || !strings.Contains(attempts, `"result_status"`) || strings.Contains(attempts, `"id"`) {
			t.Errorf("show --json attempts: %s", attempts)
		}
		// A row never attempted has a list, empty, not null.
		none := b.mustRun(t, "show", "--json", "--mappings", "../../mappings", "bad-mapping")
		if !strings.Contains(none, `"attempts": []`) {
			t.Errorf("show --json of a row never attempted:\n%s", none)
		}
	})

	t.Run("WhatAHeldRowWaitsBehind", func(t *testing.T) {
		t.Parallel()
		db := fixture.New(t, b.pool)
		const okey = "P9/B-held"
		head := db.Insert(fixture.Row{Key: "enter-\x1b[2J", Status: "FAILED", FailureClass: "REJECTED", Attempts: 2,
			LastError: "platform errcode 998", OrderingKey: okey, OrderBlocked: true})[0]
		db.Insert(fixture.Row{Key: "exit-held", OrderingKey: okey, OrderHeld: true},
			fixture.Row{Key: "later-held", OrderingKey: okey, OrderHeld: true})
		out := b.mustRun(t, "show", "--mappings", "../../mappings", "later-held")
		want := "row " + strconv.FormatInt(head, 10) + ` (message_key enter-\u{001b}[2J): FAILED, 2 attempts, blocking its key ` +
			"(ORDER_ON_FAILED=block; forwarder outbox release --id " + strconv.FormatInt(head, 10) + " lets the key go on), " +
			"last error: platform errcode 998; then 1 more of the key before this one"
		if got := field(out, "held behind"); got != want {
			t.Errorf("held behind: %q, want %q", got, want)
		}
		var v struct {
			HeldBehind *struct {
				ID           int64  `json:"id"`
				MessageKey   string `json:"message_key"`
				OrderBlocked bool   `json:"order_blocked"`
				HeldBefore   int64  `json:"held_before"`
			} `json:"held_behind"`
		}
		js := b.mustRun(t, "show", "--json", "--mappings", "../../mappings", "exit-held")
		if err := json.Unmarshal([]byte(js), &v); err != nil {
			t.Fatalf("%v:\n%s", err, js)
		}
		if h := v.HeldBehind; h == nil || h.ID != head || h.MessageKey != "enter-\x1b[2J" || !h.OrderBlocked || h.HeldBefore != 0 {
			t.Errorf("show --json of a held row: held_behind %+v, want row %d, blocking, none before", h, head)
		}
		if out := b.mustRun(t, "show", "--mappings", "../../mappings", "enter-\x1b[2J"); strings.Contains(out, "held behind") {
			t.Errorf("the head is shown held:\n%s", out)
		}
	})

	t.Run("NoSuchRowExits1", func(t *testing.T) {
		t.Parallel()
		for _, ref := range []string{"no-such-key", "987654321"} {
			out, err := b.run(t, "show", ref)
			if exitCode(err) != 1 || !strings.Contains(err.Error(), "no row with message_key or id") {
				t.Errorf("show %s: exit %d, %v (%q); want exit status 1", ref, exitCode(err), err, out)
			}
		}
	})
}

func TestFind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := lookupFixture(t, b)
	const key = "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11"

	t.Run("PlateTable", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "find", "--plate", "粤B12345")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "LAST_ERROR") ||
			!strings.HasPrefix(lines[1], strconv.FormatInt(ids[key], 10)+" ") || !strings.Contains(lines[1], "FAILED/REJECTED") ||
			!strings.Contains(lines[1], " 998 ") || !strings.Contains(lines[1], key) {
			t.Errorf("find --plate:\n%s", out)
		}
	})

	// Plates hold Chinese characters, two columns wide on a terminal: the
	// columns after them line up by display width, not by characters.
	t.Run("ColumnsLineUpWithChinesePlates", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "find", "--park", "P1001")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) < 3 {
			t.Fatalf("find --park P1001:\n%s", out)
		}
		columnOf := func(line, text string) int {
			i := strings.Index(line, text)
			if i < 0 {
				t.Fatalf("%q not in %q", text, line)
			}
			return displayWidth(line[:i])
		}
		want := columnOf(lines[0], "PARK")
		for _, l := range lines[1:] {
			if got := columnOf(l, "P1001"); got != want {
				t.Errorf("PARK at column %d, P1001 at %d:\n%s", want, got, out)
			}
		}
	})

	t.Run("JSONLines", func(t *testing.T) {
		t.Parallel()
		out := b.mustRun(t, "find", "--park", "P1001", "--json")
		var got []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%v: %q", err, line)
			}
			got = append(got, m)
		}
		if len(got) != 2 || got[0]["message_key"] != "other-plate" || got[1]["message_key"] != key {
			t.Fatalf("find --park P1001 --json: %v, want both rows of the park, newest first", got)
		}
		for _, field := range []string{"id", "message_key", "status", "attempt_count", "last_error", "plate_no", "park_code",
			"berth_code", "device_id", "created_at", "api_type"} {
			if _, ok := got[1][field]; !ok {
				t.Errorf("no %s in %v", field, got[1])
			}
		}
	})

	// find reads some of a row's columns, not all: the others came out
	// as zero values, so a FAILED row's failed_at was null and every row
	// sat at partition 0, offset 0 of a topic "". --json has the fields the
	// docs list, each as read.
	t.Run("JSONHasOnlyTheColumnsItRead", func(t *testing.T) {
		t.Parallel()
		want := []string{"id", "message_key", "api_type", "status", "failure_class", "attempt_count", "last_error",
			"last_http_status", "last_errcode", "plate_no", "park_code", "berth_code", "device_id", "created_at",
			"updated_at", "next_retry_at", "succeeded_at", "ordering_key", "order_held", "order_blocked"}
		out := b.mustRun(t, "find", "--plate", "粤B12345", "--json")
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v: %q", err, out)
		}
		var fields []string
		for f := range got {
			fields = append(fields, f)
		}
		slices.Sort(fields)
		slices.Sort(want)
		if !slices.Equal(fields, want) {
			t.Errorf("find --json fields %v, want %v", fields, want)
		}
	})

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"StatusAndErrcode", []string{"--status", "failed", "--errcode", "998"}, []string{key}},
		{"ParkAndBerth", []string{"--park", "P1001", "--berth", "B-013"}, []string{"other-plate"}},
		{"Device", []string{"--device", "d"}, []string{"bad-mapping"}},
		{"SinceAnHourAgo", []string{"--since", "1h", "--status", "FAILED"}, []string{"bad-mapping", "binary", key}},
		{"UntilAnHourAgo", []string{"--until", "1h"}, nil},
		{"Limit", []string{"--limit", "1"}, []string{"bad-mapping"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out := b.mustRun(t, append([]string{"find", "--json"}, c.args...)...)
			var keys []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line == "" {
					continue
				}
				var m struct {
					Key string `json:"message_key"`
				}
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatal(err)
				}
				keys = append(keys, m.Key)
			}
			if strings.Join(keys, ",") != strings.Join(c.want, ",") {
				t.Errorf("find %v: %v, want %v", c.args, keys, c.want)
			}
		})
	}

	t.Run("NothingFound", func(t *testing.T) {
		t.Parallel()
		if out := b.mustRun(t, "find", "--plate", "nobody"); out != "no rows match plate=\"nobody\"\n" {
			t.Errorf("output %q", out)
		}
	})

	t.Run("Explain", func(t *testing.T) {
		t.Parallel()
		// The plan names the plate index of each partition it walks.
		var partitionIndexes []string
		if err := b.pool.QueryRow(context.Background(), `SELECT array_agg(c.relname::text)
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'forward_messages_plate_idx'::regclass`).Scan(&partitionIndexes); err != nil {
			t.Fatal(err)
		}
		out := b.mustRun(t, "find", "--plate", "x", "--explain")
		if !slices.ContainsFunc(partitionIndexes, func(idx string) bool {
			return strings.Contains(out, `"Index Name": "`+idx+`"`)
		}) {
			t.Errorf("find --explain walks none of %v:\n%s", partitionIndexes, out)
		}
	})

	t.Run("BadFlags", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"--limit", "0"}, {"--limit", "1001"}, {"--status", "DONE"}, {"--since", "yesterday"},
			{"--since", "1h", "--until", "2h"}} {
			if out, err := b.run(t, append([]string{"find"}, args...)...); exitCode(err) != 2 {
				t.Errorf("find %v: %v (%q), want exit status 2", args, err, out)
			}
		}
	})
}

// TestFindRefusesAnEmptyFilter: `find --plate "$PLATE"` with PLATE unset
// listed the newest rows of every plate, as if they matched, in the same
// table as a real match. A filter given empty is refused (exit status 2),
// as an empty --operator is.
func TestFindRefusesAnEmptyFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lookupFixture(t, b)
	for _, flag := range []string{"--plate", "--park", "--berth", "--device", "--status", "--errcode", "--since", "--until"} {
		out, err := b.run(t, "find", flag, "")
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "outbox find: "+flag+" is empty") {
			t.Errorf("find %s '': exit %d, %v; want exit status 2 saying %s is empty\n%s", flag, exitCode(err), err, flag, out)
		}
	}
}

// TestShowSaysWhenThePlatformIsStopped: an unfinished row, while the
// breaker is open or delivery paused, says it is not sent for now and why;
// a delivered row says nothing of the platform.
func TestShowSaysWhenThePlatformIsStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := fixture.New(t, b.pool)
	db.Insert(fixture.Row{Key: "waiting"}, fixture.Row{Key: "delivered", Status: "SUCCESS"})
	if out := b.mustRun(t, "show", "--mappings", "../../mappings", "waiting"); strings.Contains(out, "not sent for now") {
		t.Errorf("with the breaker closed, the row is said not to be sent:\n%s", out)
	}
	// A Retry-After pause alone, the breaker closed.
	if _, err := outboxdb.PausePlatform(context.Background(), b.pool, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if out := b.mustRun(t, "show", "--mappings", "../../mappings", "waiting"); !regexp.MustCompile(
		`not sent for now, like every unfinished row:\nplatform: breaker CLOSED for \S+; sending paused for (1m\d+s|2m) \(Retry-After\)\n`).MatchString(out) {
		t.Errorf("with a Retry-After pause:\n%s", out)
	}
	ok, err := outboxdb.SetBreaker(context.Background(), b.pool, []string{"CLOSED"}, "OPEN", "test", "http 503: unavailable", 5*time.Second)
	if err != nil || !ok {
		t.Fatalf("opening the breaker: %v, %v", ok, err)
	}
	out := b.mustRun(t, "show", "--mappings", "../../mappings", "waiting")
	if !strings.Contains(out, "not sent for now, like every unfinished row:\nplatform: breaker OPEN for ") ||
		!strings.Contains(out, "(http 503: unavailable), next probe in ") {
		t.Errorf("with the breaker open:\n%s", out)
	}
	b.mustRun(t, "pause", "--reason", "platform upgrade", "--operator", "alice")
	out = b.mustRun(t, "show", "--mappings", "../../mappings", "waiting")
	if !strings.Contains(out, "delivery: PAUSED by alice for ") || !strings.Contains(out, "platform upgrade") {
		t.Errorf("with delivery paused:\n%s", out)
	}
	if out := b.mustRun(t, "show", "--mappings", "../../mappings", "delivered"); strings.Contains(out, "not sent for now") {
		t.Errorf("a delivered row is said not to be sent:\n%s", out)
	}
}
