package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// CopyBytesPerSecond is how fast an offline migration copies: bytes of the
// copied tables (heap, TOAST and indexes, pg_total_relation_size) per
// second. Measured: TestUpgradeToSchema5 upgraded 1 000 000 schema-4 rows
// and 1 700 000 attempt logs, 1.2 GB, in 88 s on PostgreSQL 15 sharing two
// cores with other work (docs/deployment.md, "Upgrading to schema 5").
// PlanMigrations divides by it; a faster server copies faster.
const CopyBytesPerSecond = 14 << 20

// CopiedTable is a table an offline migration copies, as the statistics
// see it before the copy.
type CopiedTable struct {
	Name string
	// Rows is the planner's estimate (pg_class.reltuples, else the live
	// rows of pg_stat_user_tables).
	Rows int64
	// Bytes is its size on disk with its TOAST table and indexes.
	Bytes int64
}

// MigrationPlan is what a pending migration will do to a database.
type MigrationPlan struct {
	Migration Migration
	// Copies are the tables it copies (Migration.Copies) that exist.
	Copies []CopiedTable
	// Estimate is how long the copy is expected to hold its lock: the
	// bytes copied at CopyBytesPerSecond. Zero when nothing is copied.
	Estimate time.Duration
	// Fresh: the database has no schema yet, so the migrations create it
	// whole and there is nothing to copy and no instance to stop.
	Fresh bool
}

// PlanMigrations says what ms, the migrations pending on the database of q,
// will lock and for how long (an estimate from the size of the tables they
// copy), for `outbox migrate` to print before it starts.
func PlanMigrations(ctx context.Context, q Querier, ms []Migration) ([]MigrationPlan, error) {
	current, err := SchemaVersion(ctx, q)
	if err != nil {
		return nil, err
	}
	plans := make([]MigrationPlan, 0, len(ms))
	for _, m := range ms {
		p := MigrationPlan{Migration: m, Fresh: current == 0}
		if p.Fresh {
			plans = append(plans, p)
			continue
		}
		var bytes int64
		for _, table := range m.Copies {
			c := CopiedTable{Name: table}
			err := q.QueryRow(ctx, `SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
					ELSE coalesce(pg_stat_get_live_tuples(c.oid), 0) END,
				pg_total_relation_size(c.oid)
				FROM pg_class c WHERE c.oid = to_regclass($1)`, table).Scan(&c.Rows, &c.Bytes)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // a fresh database: nothing to copy
			}
			if err != nil {
				return nil, fmt.Errorf("reading the size of %s for the plan of %s: %w", table, m.Name, err)
			}
			p.Copies = append(p.Copies, c)
			bytes += c.Bytes
		}
		if len(p.Copies) > 0 {
			// In floating point: bytes × 1e9 overflows an int64 from 9 GB on.
			p.Estimate = max(time.Second, time.Duration(float64(bytes)/CopyBytesPerSecond*float64(time.Second)).Round(time.Second))
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// Lines says what the migration locks, for how long, and what the
// operator must do first; none for an online migration or a database
// without a schema yet.
func (p MigrationPlan) Lines() []string {
	if p.Migration.Online || p.Fresh {
		return nil
	}
	var lines []string
	if len(p.Copies) > 0 {
		var what, names []string
		var bytes int64
		for _, c := range p.Copies {
			what = append(what, fmt.Sprintf("%s (about %s rows, %s)", c.Name, groupDigits(c.Rows), formatBytes(c.Bytes)))
			names = append(names, c.Name)
			bytes += c.Bytes
		}
		lines = append(lines,
			fmt.Sprintf("%s copies %s holding an ACCESS EXCLUSIVE lock on %s until it commits: nothing reads or writes them meanwhile",
				p.Migration.Name, joinAnd(what), joinAnd(names)),
			fmt.Sprintf("expect the lock for about %s (%s at %s/s, the rate measured in docs/deployment.md, \"Upgrading to schema 5\"), and free disk for another copy of them",
				FormatDuration(p.Estimate), formatBytes(bytes), formatBytes(CopyBytesPerSecond)))
	}
	return append(lines, "stop every instance first: "+p.Migration.Name+" is offline, and is refused while instances use the database unless forced")
}

// formatBytes writes n bytes for people: 512 B, 12.3 MB, 1.4 GB (powers of
// 1024).
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, suffix := float64(n)/unit, "kB"
	for _, s := range []string{"MB", "GB", "TB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + suffix
}

// groupDigits writes n with a space every three digits: 1 000 000.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func joinAnd(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
