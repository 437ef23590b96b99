package outboxdb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestPlanMigrations: what `outbox migrate` says before an offline
// migration that copies tables (the "-- copies:" directive): which tables,
// how big, which lock, how long, and to stop the instances first.
func TestPlanMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TheCopiesDirectiveNamesTables", func(t *testing.T) {
		m, err := outboxdb.ParseMigration("0007_copy.sql", "-- copies: forward_records, forward_retry_logs\nSELECT 1;\n")
		if err != nil || len(m.Copies) != 2 || m.Copies[0] != "forward_records" || m.Copies[1] != "forward_retry_logs" || m.Online {
			t.Fatalf("parsed %+v (%v), want an offline migration copying forward_records and forward_retry_logs", m, err)
		}
		if _, err := outboxdb.ParseMigration("0007_copy.sql", "-- copies: forward_records; DROP TABLE x\nSELECT 1;\n"); err == nil ||
			!strings.Contains(err.Error(), "table names") {
			t.Errorf("a copies directive that is not table names: err = %v, want it refused", err)
		}
	})

	t.Run("Schema5CopiesTheSchema4Tables", func(t *testing.T) {
		ms := mustMigrations(t)
		if got := strings.Join(ms[4].Copies, ","); ms[4].Version != 5 || got != "forward_records,forward_retry_logs" {
			t.Fatalf("migration %s copies %q, want forward_records,forward_retry_logs", ms[4].Name, got)
		}
	})

	t.Run("ItSaysWhatItLocksForHowLong", func(t *testing.T) {
		pool := openEmpty(t)
		ms := mustMigrations(t)
		migrateTo(t, pool, ms[:4])
		exec(t, pool, `INSERT INTO forward_records (message_key, api_type, kafka_topic, kafka_partition, kafka_offset, payload)
			SELECT 'k-' || g, 'VEHICLE_EVENT', 't', 0, g, convert_to(repeat('x', 900), 'UTF8') FROM generate_series(1, 3000) g`)
		exec(t, pool, `ANALYZE forward_records`)
		plans, err := outboxdb.PlanMigrations(ctx, pool, ms[4:5])
		if err != nil || len(plans) != 1 {
			t.Fatalf("plans %+v, %v", plans, err)
		}
		p := plans[0]
		if len(p.Copies) != 2 || p.Copies[0].Rows != 3000 || p.Copies[0].Bytes < 3000*900 || p.Copies[1].Rows != 0 {
			t.Errorf("copies %+v, want forward_records with its 3 000 rows and their bytes, and an empty forward_retry_logs", p.Copies)
		}
		if p.Estimate <= 0 {
			t.Errorf("estimate %s, want a duration", p.Estimate)
		}
		text := strings.Join(p.Lines(), "\n")
		for _, want := range []string{"ACCESS EXCLUSIVE lock on forward_records and forward_retry_logs", "3 000 rows",
			"expect the lock for about", "stop every instance first"} {
			if !strings.Contains(text, want) {
				t.Errorf("the plan does not say %q:\n%s", want, text)
			}
		}
	})

	t.Run("AFreshDatabaseHasNothingToCopy", func(t *testing.T) {
		pool, err := outboxdb.Open(ctx, pgtest.NewEmptyDB(t), outboxdb.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		plans, err := outboxdb.PlanMigrations(ctx, pool, mustMigrations(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range plans {
			if len(p.Copies) > 0 || p.Estimate != 0 || len(p.Lines()) > 0 {
				t.Errorf("%s on an empty database: copies %+v, estimate %s, says %q; want nothing", p.Migration.Name, p.Copies, p.Estimate, p.Lines())
			}
		}
	})
}
