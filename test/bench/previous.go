package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/jackc/pgx/v5/pgxpool"
)

// scenarioPrevious is an earlier build of the forwarder, run from its own
// checkout (-previous DIR: DIR/bin/forwarder with DIR's pipeline and
// mappings) in the same run as today's, so that a change is measured
// against what it replaced on the same server, minutes apart:
//
//	git worktree add /tmp/before <rev> && make -C /tmp/before build
//	go run ./test/bench -previous /tmp/before -scenarios forwarder,forwarder-previous
const scenarioPrevious = "forwarder-previous"

func init() {
	scenarioTitles[scenarioPrevious] = "forwarder, previous build"
}

// previousTitle names the previous build by its checkout's commit.
func previousTitle(dir string) string {
	out, err := exec.Command("git", "-C", dir, "log", "-1", "--format=%h").Output()
	if err != nil {
		return "forwarder, previous build (" + dir + ")"
	}
	return "forwarder at " + strings.TrimSpace(string(out))
}

// checkPrevious says what is missing from a -previous checkout.
func checkPrevious(dir string) error {
	if dir == "" {
		return fmt.Errorf("-scenarios %s needs -previous DIR, a checkout with bin/forwarder built", scenarioPrevious)
	}
	for _, f := range []string{"bin/forwarder", "pipelines/forwarder.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("-previous %s: %w (build it with make -C %s build)", dir, err, dir)
		}
	}
	return nil
}

// migrate creates the schema of a run's database: the previous build's own
// for its runs (named after the scenario), River's for the River baseline's,
// the wide row of schema 4 for the hand-written baselines', today's for the
// forwarder's.
func (env *benchEnv) migrate(ctx context.Context, run string, pool *pgxpool.Pool, dsn string) error {
	switch {
	case strings.HasSuffix(run, "_"+scenarioRiver):
		return env.migrateRiver(ctx, run, dsn)
	case strings.HasSuffix(run, "_"+scenarioNaive), strings.HasSuffix(run, "_"+scenarioBatched):
		return migrateWide(ctx, pool)
	case !strings.HasSuffix(run, "_"+scenarioPrevious):
		_, err := outboxdb.Migrate(ctx, pool)
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(env.cfg.Previous, "bin", "forwarder"), "outbox", "migrate")
	cmd.Dir = env.cfg.Previous
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("migrating %s with the previous build: %w\n%s", run, err, out)
	}
	return nil
}

// wideSchema is the last schema version with one forward_records row per
// message, updated in place by every state change: the table a developer
// writing the loop by hand would keep (test/bench/sql).
const wideSchema = 4

// migrateWide gives a baseline's database the wide schema: the embedded
// migrations up to wideSchema.
func migrateWide(ctx context.Context, pool *pgxpool.Pool) error {
	ms, err := outboxdb.Migrations()
	if err != nil {
		return err
	}
	var wide []outboxdb.Migration
	for _, m := range ms {
		if m.Version <= wideSchema {
			wide = append(wide, m)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := outboxdb.MigrateConn(ctx, conn.Conn(), outboxdb.MigrateOptions{Migrations: wide}); err != nil {
		return fmt.Errorf("migrating a baseline's database to schema %d: %w", wideSchema, err)
	}
	return nil
}
