package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// retentionLockKey is the pg_try_advisory_lock key of the periodic purge
// ("forwpurg"), distinct from MigrationLockKey: with several instances
// configured to purge, the one that holds it purges and the others skip
// their turn instead of all walking the same rows at once.
const retentionLockKey int64 = 0x666f7277_70757267

// unlockTimeout bounds the advisory unlock after a purge.
const unlockTimeout = 5 * time.Second

// TryPurge runs Purge on one connection of pool while holding the retention
// advisory lock, so that of several instances purging on a schedule only one
// works at a time. locked is false, and nothing is deleted, when another
// session holds the lock. The lock belongs to the session and is held for
// the whole run (every batch); it is released when Purge returns, and if the
// unlock cannot be sent (ctx cancelled mid-statement, connection lost) the
// connection is closed, which releases it too.
//
// The CLI's `outbox purge` does not take the lock: it may run beside a
// scheduled purge (both skip rows the other holds).
func TryPurge(ctx context.Context, pool *pgxpool.Pool, opts PurgeOptions) (res PurgeResult, locked bool, err error) {
	return TryPurgeWithSession(ctx, pool, nil, opts)
}

// TryPurgeWithSession is TryPurge for a pool behind a transaction pooler,
// where a session lock taken on a pooled connection would stay on whichever
// server session ran it: the lock is held on a connection of its own
// dialled from session (DATABASE_DIRECT_URL's settings), closed afterwards,
// and the batches run on pool. A nil session is TryPurge.
func TryPurgeWithSession(ctx context.Context, pool *pgxpool.Pool, session *pgx.ConnConfig, opts PurgeOptions) (res PurgeResult, locked bool, err error) {
	// lockConn holds the lock; q runs the batches.
	var lockConn *pgx.Conn
	var q Querier
	if session != nil {
		conn, err := pgx.ConnectConfig(ctx, session.Copy())
		if err != nil {
			return res, false, fmt.Errorf("connecting for the retention lock: %w", err)
		}
		// Closing the session releases the lock, whatever happened; but the
		// server ends the session a moment after the client closes it, so
		// the lock is released first, in a statement (below), for whoever
		// asks right after this returns.
		defer conn.Close(context.WithoutCancel(ctx))
		// The session is idle while the retirements run on pool, for as
		// long as the purge takes: an idle_session_timeout set by an
		// administrator would end it mid-purge, and the lock with it.
		// (Before PostgreSQL 14 there is no such setting.)
		if _, err := conn.Exec(ctx, "SELECT set_config(name, '0', false) FROM pg_settings WHERE name = 'idle_session_timeout'"); err != nil {
			return res, false, fmt.Errorf("connecting for the retention lock: %w", err)
		}
		lockConn, q = conn, pool
	} else {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return res, false, fmt.Errorf("acquiring a connection to purge: %w", err)
		}
		defer conn.Release()
		lockConn, q = conn.Conn(), conn
	}
	if err := lockConn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", retentionLockKey).Scan(&locked); err != nil {
		return res, false, fmt.Errorf("taking the retention lock: %w", err)
	}
	if !locked {
		return res, false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		var unlocked bool
		if err := lockConn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", retentionLockKey).Scan(&unlocked); err != nil || !unlocked {
			// A closed session holds no locks; the pool drops a closed
			// connection on Release.
			_ = lockConn.Close(uctx)
		}
	}()
	res, err = Purge(ctx, q, opts)
	return res, true, err
}
