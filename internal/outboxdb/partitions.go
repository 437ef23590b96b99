package outboxdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Messages and their attempt logs are partitioned by creation time
// (docs/architecture.md, "Partitions"): forward_partition_ensure (migration
// 0005) creates the partitions, forward_partition_retire drops them
// (purge.go).

// Partition widths OUTBOX_PARTITION accepts (docs/configuration.md).
const (
	// DefaultPartitionWidth is a day: retention by whole days, and a
	// dedupe probe that visits one partition per day kept.
	DefaultPartitionWidth = 24 * time.Hour
	// MinPartitionWidth: narrower partitions would multiply the partitions
	// the insert's dedupe probe visits (one per partition kept).
	MinPartitionWidth = time.Hour
	// MaxPartitionWidth: wider partitions make retention coarser; a week
	// is kept up to two weeks.
	MaxPartitionWidth = 7 * 24 * time.Hour
	// PartitionsAhead is how many partitions after the current one
	// EnsurePartitions keeps ready.
	PartitionsAhead = 3
)

// ParsePartitionWidth reads a partition width such as "1d" or "6h"
// (ParseDuration's syntax): a whole number of hours from
// MinPartitionWidth to MaxPartitionWidth. Partitions are aligned on
// midnight UTC of 2000-01-01, so whole hours keep their bounds on the
// hour whatever the width.
func ParsePartitionWidth(s string) (time.Duration, error) {
	d, err := ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if err := CheckPartitionWidth(d); err != nil {
		return 0, fmt.Errorf("%s: %w", s, err)
	}
	return d, nil
}

// CheckPartitionWidth says why d cannot be a partition width, or returns
// nil.
func CheckPartitionWidth(d time.Duration) error {
	if d < MinPartitionWidth || d > MaxPartitionWidth || d%time.Hour != 0 {
		// The bounds as a user writes them.
		return errors.New("a partition width must be a whole number of hours from 1h to 7d, e.g. 1d or 6h")
	}
	return nil
}

// EnsurePartitions creates the partitions of width that cover the current
// time and PartitionsAhead widths after it, where none exist yet, and
// returns how many it created. Ranges already covered, whatever their
// width, are left alone, so a width may change from one run to the next.
// Any number of instances may call it at once: the database function
// serialises them, and creating a partition does not stop inserts or
// claims (ATTACH PARTITION takes a SHARE UPDATE EXCLUSIVE lock).
func EnsurePartitions(ctx context.Context, q Querier, width time.Duration) (int, error) {
	if err := CheckPartitionWidth(width); err != nil {
		return 0, err
	}
	var created int
	if err := q.QueryRow(ctx, partitionEnsureSQL, width.Microseconds(), PartitionsAhead).Scan(&created); err != nil {
		return 0, fmt.Errorf("creating partitions ahead: %w", err)
	}
	return created, nil
}

// ensureCurrentPartition creates the partition the current time falls in,
// and the next one, as wide as the newest partition (a day when there is
// none): what an insert that found no partition for its rows needs.
func ensureCurrentPartition(ctx context.Context, q Querier) error {
	if _, err := q.Exec(ctx, partitionEnsureCurrentSQL); err != nil {
		return fmt.Errorf("creating the current partition: %w", err)
	}
	return nil
}

// isMissingPartition reports whether err is PostgreSQL's refusal of a row
// that no partition covers.
func isMissingPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// Partition is one range of forward_partitions: the messages created in
// [Lower, Upper) and their attempt logs, in two tables.
type Partition struct {
	Lower     time.Time `db:"lower"`
	Upper     time.Time `db:"upper"`
	Messages  string    `db:"messages"`
	RetryLogs string    `db:"retry_logs"`
}

// Label names the partition for people: its day ("2026-11-20") for a
// partition of one UTC day, else its bounds in UTC.
func (p Partition) Label() string {
	return partitionLabel(p.Lower, p.Upper)
}

func partitionLabel(lower, upper time.Time) string {
	lower, upper = lower.UTC(), upper.UTC()
	if upper.Sub(lower) == 24*time.Hour && lower.Equal(lower.Truncate(24*time.Hour)) {
		return lower.Format("2006-01-02")
	}
	if lower.Format("2006-01-02") == upper.Format("2006-01-02") {
		return lower.Format("2006-01-02 15:04") + "–" + upper.Format("15:04Z")
	}
	return lower.Format("2006-01-02 15:04Z") + " – " + upper.Format("2006-01-02 15:04Z")
}

// ListPartitions returns every partition, oldest first.
func ListPartitions(ctx context.Context, q Querier) ([]Partition, error) {
	return queryAll(ctx, q, "listing partitions", partitionListSQL, pgx.RowToStructByName[Partition])
}
