package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// scenarioRiver is the pipeline written with River, the job queue a Go
// developer would pick instead of the forwarder: one job per message
// inserted in the consumer's transaction, 64 River workers POSTing
// (test/bench/riverbaseline). It is a module of its own, so that River never
// enters the product's go.mod; the bench builds it into its work directory.
const scenarioRiver = "river"

// riverDir is the River baseline's module, relative to the repository root.
const riverDir = "test/bench/riverbaseline"

func init() {
	scenarioTitles[scenarioRiver] = "River"
}

// buildRiver compiles the River baseline into the work directory.
func (env *benchEnv) buildRiver(ctx context.Context) error {
	logf("building the River baseline (%s)", riverDir)
	bin := filepath.Join(env.dir, "riverbaseline")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(env.cfg.Root, riverDir)
	// Its own go.mod, whatever workspace the bench was started in.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the River baseline in %s: %w\n%s", riverDir, err, out)
	}
	env.riverBin = bin
	return nil
}

// migrateRiver creates River's schema in a run's database with River's own
// migrator (riverbaseline migrate).
func (env *benchEnv) migrateRiver(ctx context.Context, run, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.riverBin, "migrate")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn, "LOG_LEVEL=WARN")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("migrating %s with River's migrator: %w\n%s", run, err, out)
	}
	return nil
}

// progressSQL is how the bench reads a run's progress from its database.
type progressSQL struct {
	// Unfinished counts the rows not yet delivered, Total every row.
	Unfinished, Total string
	// Window counts the delivered rows and gives the first one's creation
	// and the last one's delivery, on the database clock.
	Window string
	// Watch gives, cheaply, an id high-water mark (the rows persisted so
	// far) and the unfinished rows, every 2 s of the latency phase.
	Watch string
}

// outboxProgress reads the forwarder's outbox (docs/architecture.md, the
// data model): a message is unfinished while it has a delivery row, and
// delivered by the result write that logs its SUCCESS attempt, whose
// attempted_at is that write's time.
var outboxProgress = progressSQL{
	Unfinished: `SELECT count(*) FROM forward_deliveries`,
	Total:      `SELECT count(*) FROM forward_messages`,
	Window: `SELECT count(*), min(record_created_at), max(attempted_at) FROM forward_retry_logs
		WHERE result_status = 'SUCCESS'`,
	// The id sequence's high-water mark (ids are not reused) and the
	// delivery rows left.
	Watch: `SELECT (SELECT coalesce(max(id), 0) FROM forward_messages),
		(SELECT count(*) FROM forward_deliveries)`,
}

// wideProgress reads the wide forward_records table of the hand-written
// baselines and of a previous build (schema 4).
var wideProgress = progressSQL{
	Unfinished: `SELECT count(*) FROM forward_records WHERE status <> 'SUCCESS'`,
	Total:      `SELECT count(*) FROM forward_records`,
	Window:     `SELECT count(*), min(created_at), max(succeeded_at) FROM forward_records WHERE status = 'SUCCESS'`,
	// The identity's high-water mark (ids are not reused) and the partial
	// index of unfinished rows.
	Watch: `SELECT (SELECT coalesce(max(id), 0) FROM forward_records),
		(SELECT count(*) FROM forward_records WHERE status <> 'SUCCESS')`,
}

// riverNotCompleted counts the jobs in every state but completed. Naming
// the states lets PostgreSQL count them in River's fetch index, which
// state leads, instead of reading the whole table, whose cost would be
// charged to River's run (EXPLAIN ANALYZE, 200 000 jobs of which 2 000
// unfinished: an index-only scan in 27 ms; state <> 'completed', a
// parallel sequential scan in 437 ms).
const riverNotCompleted = `SELECT count(*) FROM river_job
	WHERE state IN ('available', 'cancelled', 'discarded', 'pending', 'retryable', 'running', 'scheduled')`

// riverProgress reads River's jobs. A job's finalized_at is when its
// worker returned, written by River's batch completer up to 250 ms later:
// the River window ends that much earlier than an outbox one, which ends
// with the result's write.
var riverProgress = progressSQL{
	Unfinished: riverNotCompleted,
	Total:      `SELECT count(*) FROM river_job`,
	Window:     `SELECT count(*), min(created_at), max(finalized_at) FROM river_job WHERE state = 'completed'`,
	Watch:      `SELECT (SELECT coalesce(max(id), 0) FROM river_job), (` + riverNotCompleted + `)`,
}

// progressOf is how a scenario's progress is read.
func progressOf(scenario string) progressSQL {
	switch scenario {
	case scenarioRiver:
		return riverProgress
	case scenarioNaive, scenarioBatched, scenarioPrevious:
		return wideProgress
	}
	return outboxProgress
}
