package outboxdb

import (
	"embed"
	"fmt"
	"regexp"
	"strings"
)

// Every statement the package runs is a file in sql/, read here once under
// one name: the file behind a name, and the names of a file, are found in
// this one place.

//go:embed sql/*.sql
var sqlFS embed.FS

// mustSQL returns an embedded query; a missing file is a build mistake. A
// line "-- include: NAME.sql" stands for that file, indented as the line:
// a condition that two statements must spell alike is written once.
func mustSQL(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name)
	if err != nil {
		panic(fmt.Sprintf("outboxdb: embedded query %s: %v", name, err))
	}
	return includeLine.ReplaceAllStringFunc(string(b), func(line string) string {
		m := includeLine.FindStringSubmatch(line)
		indent, part := m[1], strings.TrimRight(mustSQL(m[2]), "\n")
		return indent + strings.ReplaceAll(part, "\n", "\n"+indent)
	})
}

var includeLine = regexp.MustCompile(`(?m)^([ \t]*)-- include: (\S+\.sql)[ \t]*$`)

var (
	// The write path: insert, claim, lease renewal, result write.
	insertSQL         = mustSQL("insert.sql")
	insertBackstopSQL = mustSQL("insert_backstop.sql")
	keyConflictsSQL   = mustSQL("insert_conflicts.sql")
	reusedCoordsSQL   = mustSQL("insert_reused_coordinates.sql")
	claimSQL          = mustSQL("claim.sql")
	claimProbeSQL     = spliceLocked(claimSQL, mustSQL("claim_probe.sql"))
	nextDueSQL        = mustSQL("next_due.sql")
	renewSQL          = mustSQL("renew.sql")
	renewSettledSQL   = mustSQL("renew_settled.sql")
	recordSQL         = mustSQL("record.sql")
	releaseSQL        = mustSQL("release.sql")

	// Per-key ordering (ordering.go).
	orderLockSQL         = mustSQL("order_lock.sql")
	orderLockActiveSQL   = mustSQL("order_lock_active.sql")
	orderReleaseSQL      = mustSQL("order_release.sql")
	orderRepairFindSQL   = mustSQL("order_repair_find.sql")
	orderRepairSQL       = mustSQL("order_repair.sql")
	orderStatsBlockedSQL = mustSQL("order_stats_blocked.sql")

	// The shared platform state and the operator's pause (platform.go).
	platformReadSQL   = mustSQL("platform_read.sql")
	platformSetSQL    = mustSQL("platform_set.sql")
	platformProbeSQL  = mustSQL("platform_probe.sql")
	platformPauseSQL  = mustSQL("platform_pause.sql")
	platformRateSQL   = mustSQL("platform_rate.sql")
	deliveryPauseSQL  = mustSQL("delivery_pause.sql")
	deliveryResumeSQL = mustSQL("delivery_resume.sql")

	// Partitions and retention (partitions.go, purge.go).
	partitionEnsureSQL        = mustSQL("partition_ensure.sql")
	partitionEnsureCurrentSQL = mustSQL("partition_ensure_current.sql")
	partitionListSQL          = mustSQL("partition_list.sql")
	purgePlanSQL              = mustSQL("admin_purge_plan.sql")
	purgeSQL                  = mustSQL("admin_purge.sql")

	// The operator's queries: `forwarder outbox stats|requeue|purge`, and
	// the dev stack's progress.
	statsStatusSQL   = mustSQL("admin_stats_status.sql")
	statsOldestSQL   = mustSQL("admin_stats_oldest.sql")
	statsReasonsSQL  = mustSQL("admin_stats_reasons.sql")
	statsErrcodesSQL = mustSQL("admin_stats_errcodes.sql")
	requeueCountSQL  = mustSQL("admin_requeue_count.sql")
	requeueSQL       = mustSQL("admin_requeue.sql")
	requeueDoneSQL   = mustSQL("admin_requeue_delivered.sql")
	progressSQL      = mustSQL("admin_progress.sql")

	// The automatic requeue of FAILED rows (compensate.go).
	compensateSQL       = mustSQL("compensate.sql")
	compensatePickSQL   = mustSQL("compensate_pick.sql")
	compensateCountsSQL = mustSQL("compensate_counts.sql")

	// The dead-letter topic's queries: the outbox_dead_letter input
	// publishes each FAILED row once it is FAILED, at least once.
	deadLetterClaimSQL   = mustSQL("deadletter_claim.sql")
	deadLetterMarkSQL    = mustSQL("deadletter_mark.sql")
	deadLetterReleaseSQL = mustSQL("deadletter_release.sql")

	// The record gauges (gauges.go).
	gaugesSQL             = mustSQL("gauges.sql")
	gaugesSuccessExactSQL = mustSQL("gauges_success_exact.sql")

	// Lookups: `forwarder outbox find|show` and the console's search and
	// record pages. Every lookup is bounded: a row limit, and a statement
	// timeout set in its own read-only transaction.
	findTemplateSQL = mustSQL("lookup_find.sql")
	findMessagesSQL = mustSQL("lookup_find_messages.sql")
	findErrcodeSQL  = mustSQL("lookup_find_errcode.sql")
	findStatusSQL   = mustSQL("lookup_find_status.sql")
	errcodesSQL     = mustSQL("lookup_errcodes.sql")
	showSQL         = mustSQL("lookup_show.sql")
	attemptsSQL     = mustSQL("lookup_attempts.sql")
	holderSQL       = mustSQL("lookup_holder.sql")

	// The console's overview and failure pages, and its operator log. Each
	// page runs inside ReadOnly, so it is bounded by the lookup statement
	// timeout.
	failedGroupsSQL      = mustSQL("console_failed_groups.sql")
	failedClassesSQL     = mustSQL("console_failed_classes.sql")
	consoleStateSQL      = mustSQL("console_state.sql")
	consoleRatesSQL      = mustSQL("console_rates.sql")
	operatorLogInsertSQL = mustSQL("console_operator_log_insert.sql")
	operatorLogRecentSQL = mustSQL("console_operator_log_recent.sql")
)
