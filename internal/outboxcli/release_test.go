package outboxcli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/testsupport/fixture"
)

func TestRelease(t *testing.T) {
	t.Parallel()
	const berth = "P1001/B-012"

	blockedBerth := func(t *testing.T) (*testBundle, *fixture.DB, []int64) {
		b := setup(t)
		db := fixture.New(t, b.pool)
		ids := db.Insert(
			fixture.Row{Key: "enter", Status: "FAILED", OrderingKey: berth, OrderBlocked: true, LastError: "platform errcode 998"},
			fixture.Row{Key: "exit", OrderingKey: berth, OrderHeld: true},
			fixture.Row{Key: "enter-2", OrderingKey: berth, OrderHeld: true},
		)
		return b, db, ids
	}

	t.Run("StatsListTheBlockedKey", func(t *testing.T) {
		t.Parallel()
		b, _, ids := blockedBerth(t)
		out := b.mustRun(t, "stats")
		if !strings.Contains(out, "2 rows held behind an earlier row of their key") || !strings.Contains(out, "1 key blocked") ||
			!strings.Contains(out, berth) || !strings.Contains(out, strconv.FormatInt(ids[0], 10)) {
			t.Errorf("stats do not show the blocked berth:\n%s", out)
		}
		var js struct {
			Ordering struct {
				HeldRows    int64 `json:"held_rows"`
				BlockedKeys int64 `json:"blocked_keys"`
				Blocked     []struct {
					Key  string `json:"ordering_key"`
					ID   int64  `json:"id"`
					Held int64  `json:"held_rows"`
				} `json:"blocked"`
			} `json:"ordering"`
		}
		if err := json.Unmarshal([]byte(b.mustRun(t, "stats", "--json")), &js); err != nil {
			t.Fatal(err)
		}
		o := js.Ordering
		if o.HeldRows != 2 || o.BlockedKeys != 1 || len(o.Blocked) != 1 || o.Blocked[0].Key != berth || o.Blocked[0].ID != ids[0] || o.Blocked[0].Held != 2 {
			t.Errorf("stats --json ordering: %+v", o)
		}
	})

	t.Run("DryRunThenRelease", func(t *testing.T) {
		t.Parallel()
		b, db, ids := blockedBerth(t)
		out := b.mustRun(t, "release", "--key", berth, "--dry-run", "--operator", "alice")
		if !strings.Contains(out, "would be released") || !strings.Contains(out, "dry run") {
			t.Errorf("dry run said:\n%s", out)
		}
		if !db.State(ids[0]).OrderBlocked || !db.State(ids[1]).OrderHeld {
			t.Fatal("the dry run changed something")
		}
		out = b.mustRun(t, "release", "--key", berth, "--operator", "alice")
		if !strings.Contains(out, "row "+strconv.FormatInt(ids[1], 10)+" is due now") {
			t.Errorf("release said:\n%s", out)
		}
		if s := db.State(ids[0]); s.Status != "FAILED" || s.OrderBlocked {
			t.Errorf("the blocked row is %s, blocking %v", s.Status, s.OrderBlocked)
		}
		if db.State(ids[1]).OrderHeld || !db.State(ids[2]).OrderHeld {
			t.Error("release did not promote exactly the next row")
		}
		var operator string
		if err := b.pool.QueryRow(context.Background(), `SELECT operator FROM forward_operator_log WHERE action = 'release'`).Scan(&operator); err != nil || operator != "alice" {
			t.Errorf("audit: %q (%v)", operator, err)
		}
		if out, err := b.run(t, "release", "--key", berth); err == nil || !strings.Contains(out+err.Error(), "no FAILED row blocks") {
			t.Errorf("releasing it again: %v\n%s", err, out)
		}
	})

	t.Run("ByID", func(t *testing.T) {
		t.Parallel()
		b, db, ids := blockedBerth(t)
		b.mustRun(t, "release", "--id", strconv.FormatInt(ids[0], 10))
		if db.State(ids[0]).OrderBlocked || db.State(ids[1]).OrderHeld {
			t.Error("release --id did not release the key")
		}
	})

	t.Run("RequeueMakesTheBlockedRowTheHeadAgain", func(t *testing.T) {
		t.Parallel()
		b, db, ids := blockedBerth(t)
		b.mustRun(t, "requeue", "--key", "enter")
		if s := db.State(ids[0]); s.Status != "PENDING" || s.OrderHeld || s.OrderBlocked {
			t.Errorf("the requeued blocked row: %+v", s)
		}
		if !db.State(ids[1]).OrderHeld {
			t.Error("the row behind it was released by the requeue")
		}
	})

	t.Run("UsageErrors", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.run(t, "release"); err == nil {
			t.Error("release without --key or --id was accepted")
		}
		if out, err := b.run(t, "release", "--id", "999"); err == nil || !strings.Contains(out+err.Error(), "does not exist") {
			t.Errorf("release of a missing row: %v\n%s", err, out)
		}
	})
}
